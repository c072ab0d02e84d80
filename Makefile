# The two commands of the README: `make demo` and `make test`. Both create .venv and
# install what is missing (Python packages; system packages where a script needs one).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-nodeps.txt constraints.txt | cksum | cut -d' ' -f1)
DEMO_DIR := demo_runs

.PHONY: setup kinetix-cuda system-packages demo test lint format fix-copies bench constraints clean

setup: $(STAMP) system-packages

# EnvPool's Procgen (ppo_procgen.py) loads the Qt 5 runtime (libQt5Core/libQt5Gui) at run
# time, and MuJoCo renders ppo_isaacgym.py --capture-video without a display through EGL
# (Mesa's on a CPU); Debian/Ubuntu packages: libqt5gui5, libegl1 (which libqt5gui5 pulls in
# too). Installed once, with sudo when not root.
SYSTEM_LIBRARIES ?= libQt5Gui.so.5 libEGL.so.1
system-packages:
	@for library in $(SYSTEM_LIBRARIES); do ldconfig -p | grep -q "$$library" || missing=1; done; [ -z "$$missing" ] || { \
		echo "installing the Qt 5 runtime for EnvPool's Procgen and EGL (apt-get install -y libqt5gui5 libegl1)"; \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get install -y -qq libqt5gui5 libegl1 > /dev/null 2>&1 \
			|| { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq libqt5gui5 libegl1 > /dev/null; } \
			|| { echo "could not install libqt5gui5 libegl1: install Qt 5 and EGL by hand (e.g. dnf install qt5-qtbase mesa-libEGL)"; exit 1; }; }

$(STAMP): requirements.txt requirements-nodeps.txt constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch alone first, from its exact pin, so that nothing else chooses its build
	$(PY) -m pip install --quiet -c constraints.txt "$$(grep '^torch==' requirements.txt)"
	$(PY) -m pip install --quiet -r requirements.txt -c constraints.txt
	# Kinetix and the JAX libraries under it without their published dependencies (requirements-nodeps.txt says why)
	$(PY) -m pip install --quiet --no-deps --no-warn-conflicts -r requirements-nodeps.txt -c constraints.txt
	rm -f $(VENV)/.installed-*
	touch $@

# On a GPU machine, after `make setup`: JAX's CUDA 13 build (torch 2.13's CUDA) for ppo_kinetix.py, i.e. the
# jax-cuda13-plugin and jax-cuda13-pjrt wheels of requirements.txt's jax version. The NVIDIA CUDA 13 wheels that torch
# installed satisfy it (it adds nvidia-cuda-nvcc, -crt and nvvm); constraints.txt pins none of them.
kinetix-cuda: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt "jax[cuda13]==$$(sed -n 's/^jax==//p' requirements.txt)"

# Pin again every package that requirements.txt and requirements-nodeps.txt pull in (after changing either): a fresh
# install in a scratch venv (requirements-nodeps.txt with --no-deps, as above), frozen.
constraints:
	rm -rf $(VENV)-constraints && $(PYTHON) -m venv $(VENV)-constraints
	$(VENV)-constraints/bin/pip install --quiet "$$(grep '^torch==' requirements.txt)"
	$(VENV)-constraints/bin/pip install --quiet -r requirements.txt
	$(VENV)-constraints/bin/pip install --quiet --no-deps --no-warn-conflicts -r requirements-nodeps.txt
	{ grep '^#' constraints.txt; $(VENV)-constraints/bin/pip freeze | grep -v '^torch=='; } > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt
	rm -rf $(VENV)-constraints

# A short PPO Breakout run on the CPU (about a minute on 2 cores): TensorBoard logs under demo_runs/ and a PNG of
# the run as the main study's Fig. 3 draws one: the return beside the metrics (feature rank, dormant neurons, ...).
demo: $(STAMP) system-packages
	rm -rf $(DEMO_DIR)
	$(PY) ppo_atari_envpool.py --env-id Breakout-v5 --total-timesteps 24576 --metrics-interval 4 \
		--runs-dir $(DEMO_DIR)
	$(PY) sweeps/aggregate.py curves $(DEMO_DIR)/Breakout-v5__* --metrics --smooth 5 --out $(DEMO_DIR)/learning_dynamics.png
	@echo "TensorBoard: $(PY) -m tensorboard.main --logdir $(DEMO_DIR)"

# One test process per core (at most 4: the tests start processes of their own), each test sent to whichever is free.
test: $(STAMP) system-packages
	$(PY) -m pytest -n auto --maxprocesses 4 --dist worksteal

# The blocks marked `# Copied from <script>.<name>` must equal their source (.ci/check_copies.py).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) .ci/check_copies.py

# Rewrite every `# Copied from` block from its source: change the source, then run this.
fix-copies: $(STAMP)
	$(PY) .ci/check_copies.py --fix

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench: $(STAMP) system-packages
	$(PY) benchmarks/sps.py

clean:
	rm -rf $(DEMO_DIR) .pytest_cache .ruff_cache
