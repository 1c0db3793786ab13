"""``ImageSequenceClip`` of the MoviePy stand-in: writes the frames' count and digest."""

from __future__ import annotations

import hashlib

import numpy as np


class ImageSequenceClip:
    def __init__(self, frames, fps=30):
        self.frames, self.fps = list(frames), fps

    def write_videofile(self, path, logger=None):
        digest = hashlib.sha256(b"".join(np.ascontiguousarray(frame).tobytes() for frame in self.frames))
        with open(path, "w") as video:
            video.write(f"{len(self.frames)} frames at {self.fps} fps, sha256 {digest.hexdigest()}\n")
