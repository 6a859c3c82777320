"""Synthetic CosmoFlow-like dataset: C channels of an S^3 cube of int16 counts
(default 4 x 32^3; CosmoFlow's own is 4 x 128^3) and 4 float32 targets
computed from the cube, so that a model can learn them.

    python -m ddstore_bench.cosmoflow generate --out DIR [--samples N] [--size 32]
        [--channels 4] [--seed S] [--format chunked|files|both]

Sample i of seed s is made by ``numpy.random.default_rng([s, i])`` alone, so
any subset can be produced in any order (:func:`sample`):

* latent parameters: A ~ U(-1, 1) (density), T ~ U(-0.5, 0.5) (its tilt
  across channels), B ~ U(0.2, 1) (clustering), e_c ~ N(0, 0.05^2);
  w = linspace(-1, 1, C) (w = [0] when C = 1);
  a_c = A + T w_c + e_c, b_c = B (1 + 0.25 w_c);
* a field g: white noise on the S^3 grid smoothed by a periodic Gaussian of
  sigma = max(1, S/16) voxels (by FFT), then shifted and scaled to mean 0,
  standard deviation 1; one field for all channels (one universe seen at C
  redshifts);
* counts: x[c] = min(Poisson(MU0 exp(a_c + b_c g - b_c^2 / 2)), 32767),
  MU0 = 8, as int16.

The targets depend on the cube only (:func:`targets`, computed in float64 and
stored as float32). With m_c and v_c the mean and (population) variance of
x[c] over its S^3 voxels:

    z_c = log(1 + m_c) - log(1 + MU0)              # log density, ~ a_c
    r_c = log(1 + v_c / (1 + m_c))                 # log dispersion (clustering)
    y0 = mean_c z_c / 0.6                          # density
    y1 = (mean_c r_c - 1.6) / 0.65                 # clustering
    y2 = mean_c (w_c z_c) / 0.2                    # density tilt across channels
    y3 = (mean_c (w_c r_c) - 0.2) / 0.15           # clustering tilt

each of roughly unit scale (mean near 0, standard deviation 0.7-1 at sizes
8 to 32; y1 and y3 have a tail up to about 5). With one channel, y2 and y3
are constants.

Files written under DIR (:func:`generate`):

* ``DIR/cosmoflow.h5``: dataset "x" (N, C, S, S, S) int16 in chunks of one
  sample (1, C, S, S, S), uncompressed, and "y" (N, 4) float32; attrs seed,
  version, samples, size, channels;
* ``DIR/files/sample_{i:06d}.h5``: "x" (C, S, S, S) int16 and "y" (4,)
  float32, one file per sample as the original CosmoFlow data come; attrs
  seed, version, index, size, channels.

Every file is written under a temporary name and renamed, so a file present
under its final name is complete. A file whose attrs match is reused, not
written again (and generate says so), so a job can call generate every time.
"""

import operator
import os
import sys
import time

import numpy as np

__all__ = ["generate", "sample", "targets", "VERSION", "FORMATS", "CHUNKED_NAME", "FILES_DIR", "file_name"]

VERSION = 1           # bump when the samples' formulas change: files of another version are regenerated
FORMATS = ("chunked", "files", "both")
CHUNKED_NAME = "cosmoflow.h5"
FILES_DIR = "files"
MU0 = 8.0
N_TARGETS = 4
_INT16_MAX = np.iinfo(np.int16).max


def file_name(i):
    """Name of sample i's own file under DIR/files."""
    return f"sample_{i:06d}.h5"


def _int(name, v, lo):
    try:
        iv = operator.index(v)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {v!r}") from None
    if isinstance(v, bool) or iv < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return iv


def _check(samples, size, channels, seed, fmt):
    samples = _int("samples", samples, 1)
    size = _int("size", size, 4)
    channels = _int("channels", channels, 1)
    seed = _int("seed", seed, 0)
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if channels * size ** 3 * 2 >= 2 ** 32:
        raise ValueError(f"a sample of {channels} x {size}^3 int16 exceeds HDF5's 4 GiB chunk limit")
    return samples, size, channels, seed, fmt


def _weights(channels):
    return np.linspace(-1.0, 1.0, channels) if channels > 1 else np.zeros(1)


def _field(rng, size):
    """Periodic Gaussian-smoothed white noise, mean 0 and std 1."""
    w = rng.standard_normal((size, size, size))
    sigma = max(1.0, size / 16.0)
    k = np.fft.fftfreq(size) * (2 * np.pi)
    kr = np.fft.rfftfreq(size) * (2 * np.pi)
    k2 = k[:, None, None] ** 2 + k[None, :, None] ** 2 + kr[None, None, :] ** 2
    g = np.fft.irfftn(np.fft.rfftn(w) * np.exp(-0.5 * sigma * sigma * k2), s=w.shape)
    g -= g.mean()
    g /= g.std()
    return g


def targets(x):
    """The 4 float32 targets of a cube x (C, S, S, S), by the formulas of the module's doc."""
    x = np.asarray(x)
    c = x.shape[0]
    flat = x.reshape(c, -1).astype(np.float64)
    m = flat.mean(axis=1)
    v = flat.var(axis=1)
    z = np.log1p(m) - np.log1p(MU0)
    r = np.log1p(v / (1.0 + m))
    w = _weights(c)
    y = [z.mean() / 0.6, (r.mean() - 1.6) / 0.65, (w * z).mean() / 0.2, ((w * r).mean() - 0.2) / 0.15]
    return np.array(y, dtype=np.float32)


def sample(seed, i, size=32, channels=4):
    """Sample i of the dataset of this seed: (x (C, S, S, S) int16, y (4,) float32)."""
    _, size, channels, seed, _ = _check(1, size, channels, seed, "both")
    i = _int("i", i, 0)
    rng = np.random.default_rng([seed, i])
    w = _weights(channels)
    A = rng.uniform(-1.0, 1.0)
    T = rng.uniform(-0.5, 0.5)
    B = rng.uniform(0.2, 1.0)
    e = rng.normal(0.0, 0.05, channels)
    a = A + T * w + e
    b = B * (1.0 + 0.25 * w)
    g = _field(rng, size)
    x = np.empty((channels, size, size, size), np.int16)
    for c in range(channels):
        lam = MU0 * np.exp(a[c] + b[c] * g - 0.5 * b[c] * b[c])
        np.minimum(rng.poisson(lam), _INT16_MAX, out=x[c], casting="unsafe")
    return x, targets(x)


def _attrs(seed, samples, size, channels):
    return {"seed": seed, "version": VERSION, "samples": samples, "size": size, "channels": channels}


def _file_attrs(seed, i, size, channels):
    # Not the number of samples: a sample's file stays valid when N changes.
    return {"seed": seed, "version": VERSION, "index": i, "size": size, "channels": channels}


def _matches(path, want):
    import h5py
    try:
        with h5py.File(path, "r") as f:
            return all(k in f.attrs and int(f.attrs[k]) == v for k, v in want.items())
    except (OSError, KeyError, ValueError):
        return False


def _tmp(path):
    return f"{path}.tmp-{os.getpid()}"


def generate(out, samples, size=32, channels=4, seed=0, fmt="both", verbose=True):
    """Write the dataset under the directory out (see the module's doc); return
    {"chunked": DIR/cosmoflow.h5, "files": [DIR/files/sample_000000.h5, ...]}
    with the keys of the formats asked for. Files already there with the same
    attrs are reused. With fmt "files", sample files of index >= samples left by
    an earlier, larger run are removed, so DIR/files holds exactly the dataset."""
    import h5py
    samples, size, channels, seed, fmt = _check(samples, size, channels, seed, fmt)
    log = (lambda *a: print(*a, flush=True)) if verbose else (lambda *a: None)
    os.makedirs(out, exist_ok=True)
    paths = {}
    want_chunked = fmt in ("chunked", "both")
    want_files = fmt in ("files", "both")
    shape = (channels, size, size, size)
    desc = f"{samples} samples of {channels}x{size}^3 int16, seed {seed}"

    chunked = None
    if want_chunked:
        paths["chunked"] = os.path.join(out, CHUNKED_NAME)
        if _matches(paths["chunked"], _attrs(seed, samples, size, channels)):
            log(f"cosmoflow generate: {paths['chunked']} exists with the same attrs ({desc}); generation skipped")
        else:
            chunked = paths["chunked"]
    todo_files = []
    if want_files:
        fdir = os.path.join(out, FILES_DIR)
        os.makedirs(fdir, exist_ok=True)
        paths["files"] = [os.path.join(fdir, file_name(i)) for i in range(samples)]
        todo_files = [i for i, p in enumerate(paths["files"])
                      if not _matches(p, _file_attrs(seed, i, size, channels))]
        keep = set(os.path.basename(p) for p in paths["files"])
        for n in os.listdir(fdir):
            if n.startswith("sample_") and n.endswith(".h5") and n not in keep:
                os.unlink(os.path.join(fdir, n))
        if not todo_files:
            log(f"cosmoflow generate: {fdir} holds the {samples} files with the same attrs ({desc}); "
                "generation skipped")
        elif len(todo_files) < samples:
            log(f"cosmoflow generate: reusing {samples - len(todo_files)} of {samples} files in {fdir}")

    todo = sorted(set(range(samples) if chunked else []) | set(todo_files))
    if not todo:
        return paths
    todo_files = set(todo_files)
    what = " and ".join(w for w, on in (("chunked", chunked), ("files", todo_files)) if on)
    log(f"cosmoflow generate: writing {desc} ({what}) to {out}")
    t0 = time.perf_counter()
    written = 0
    last = t0
    f = None
    try:
        if chunked:
            f = h5py.File(_tmp(chunked), "w")
            f.attrs.update(_attrs(seed, samples, size, channels))
            dx = f.create_dataset("x", (samples,) + shape, np.int16, chunks=(1,) + shape)
            dy = f.create_dataset("y", (samples, N_TARGETS), np.float32)
        for n, i in enumerate(todo):
            x, y = sample(seed, i, size, channels)
            if chunked:
                dx[i] = x
                dy[i] = y
                written += x.nbytes + y.nbytes
            if i in todo_files:
                p = paths["files"][i]
                with h5py.File(_tmp(p), "w") as g:
                    g.attrs.update(_file_attrs(seed, i, size, channels))
                    g.create_dataset("x", data=x)
                    g.create_dataset("y", data=y)
                os.replace(_tmp(p), p)
                written += x.nbytes + y.nbytes
            now = time.perf_counter()
            if verbose and (now - last >= 2.0 or n + 1 == len(todo)):
                last = now
                log(f"cosmoflow generate: {n + 1}/{len(todo)} samples, {written / 1e9:.3f} GB, "
                    f"{now - t0:.1f} s")
        if chunked:
            f.close()
            f = None
            os.replace(_tmp(chunked), chunked)
    finally:
        if f is not None:
            f.close()
        if chunked and os.path.exists(_tmp(chunked)):
            os.unlink(_tmp(chunked))
        for i in todo_files:
            p = _tmp(paths["files"][i])
            if os.path.exists(p):
                os.unlink(p)
    dt = time.perf_counter() - t0
    log(f"cosmoflow generate: done, {written / 1e9:.3f} GB in {dt:.2f} s, {written / 1e9 / max(dt, 1e-9):.3f} GB/s")
    return paths
