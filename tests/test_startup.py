"""tests/startup/sitecustomize.py, loaded by every Python process of the suite, must not change what a script computes."""

import json
import subprocess
import sys

from conftest import ROOT

# Three steps of each optimizer the scripts use, through every method that torch marks for Dynamo
TRAIN = """
import torch

def train():
    weights = []
    for make in (lambda p: torch.optim.Adam(p, lr=0.1), lambda p: torch.optim.RAdam(p, lr=0.1, foreach=True)):
        weight = torch.nn.Parameter(torch.arange(4.0) - 1.5)
        optimizer = make([weight])
        for _ in range(3):
            optimizer.zero_grad()
            (weight**3).sum().backward()
            optimizer.step()  # in place on a leaf that requires grad: an error unless it runs without grad
        optimizer.load_state_dict(optimizer.state_dict())
        weights.append(weight.tolist())
    return weights
"""
TRAIN_BEFORE_AND_AFTER_IMPORTING_DYNAMO = f"""{TRAIN}
import json, sys
before = train(), "torch._dynamo" in sys.modules
import torch._dynamo
print(json.dumps([before, train()]))
"""


def test_optimizers_wait_for_dynamos_import_and_step_as_torchs_own():
    import torch._dynamo  # noqa: F401  (the reference below takes torch's own path)

    namespace = {}
    exec(TRAIN, namespace)
    expected = namespace["train"]()
    # a process of the suite (conftest.py puts tests/startup on PYTHONPATH)
    command = [sys.executable, "-c", TRAIN_BEFORE_AND_AFTER_IMPORTING_DYNAMO]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)  # noqa: PLW1510
    assert result.returncode == 0, result.stderr
    before, after = json.loads(result.stdout)
    assert before == [expected, False]  # Dynamo not imported, the weights torch's to the bit
    assert after == expected  # once it is imported, torch's own calls
