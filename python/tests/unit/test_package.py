"""What `import ddstore` loads (the client, not torch nor the benchmarks),
and the import paths of the public names."""

import json
import os
import subprocess
import sys

import pytest

PY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules(code):
    r = subprocess.run([sys.executable, "-c", code + "; import sys, json; print(json.dumps(sorted(sys.modules)))"],
                       cwd=PY, env={**os.environ, "PYTHONPATH": PY}, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.splitlines()[-1])


def test_import_ddstore_loads_the_client_only():
    mods = _modules("import ddstore")
    assert "torch" not in mods
    assert not [m for m in mods if m.startswith(("ddstore_bench", "ddstore.torch", "mpi4py", "h5py"))]
    assert "ddstore.store" in mods


def test_public_import_paths():
    pytest.importorskip("torch")
    code = ("from ddstore.torch import DistDataset, DistDatasetReader, WindowedDataset, row_of, ThreadDataLoader, "
            "ScheduledSampler; from ddstore.torch.dataset import DistDataset as D; "
            "from ddstore.torch.loader import ThreadDataLoader as L; "
            "from ddstore.torch.sampler import ScheduledSampler as S; "
            "from ddstore.sampler import ScheduledSampler as S2, EpochPlan, POLICIES; "
            "from ddstore.store import Store; from ddstore import Store as St; "
            "assert D is DistDataset and L is ThreadDataLoader and S is S2 is ScheduledSampler and St is Store")
    assert "ddstore_bench" not in _modules(code)
