"""A stand-in for MoviePy (not a test dependency): Gymnasium's ``RecordVideo`` needs only
``ImageSequenceClip(frames, fps).write_videofile(path, logger=...)``. The "video" is a text
file naming how many frames it holds and their digest, so two runs' videos can be compared."""
