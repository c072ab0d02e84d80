"""Fake of Isaac Gym's gymdeps.py: every public module of Isaac Gym imports it first, and it refuses to go on if torch
is already imported (the real one then preloads the native libraries). The message is the real one, so that a test or a
user sees what Isaac Gym would say."""

import sys

if "torch" in sys.modules:
    raise ImportError("PyTorch was imported before isaacgym modules.  Please import torch after isaacgym modules.")
