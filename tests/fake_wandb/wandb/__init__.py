"""A fake of the three parts of Weights & Biases that the scripts call (`init`, `log`, `Video`), on the path of the tiny
runs that pass --track: each call is a JSON line in the file that FAKE_WANDB_LOG names. The real package's offline
start and finish take about 9 s a run; ppo_atari_envpool.py's test uses it (WANDB_MODE=offline)."""

import json
import os


def _record(call: str, **fields) -> None:
    with open(os.environ["FAKE_WANDB_LOG"], "a") as f:
        f.write(json.dumps({"call": call, **fields}) + "\n")


class Video:
    def __init__(self, data_or_path: str, format: str | None = None):
        self.path, self.format = data_or_path, format


def init(**kwargs) -> None:
    _record("init", name=kwargs["name"], dir=kwargs["dir"], sync_tensorboard=kwargs["sync_tensorboard"])


def log(data: dict) -> None:
    _record("log", **{key: {"video": value.path, "format": value.format} for key, value in data.items()})
