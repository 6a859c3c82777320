"""An atomistic dataset of real structures: metal clusters and perturbed bulk
cells of 8 to 256 atoms, their energies and forces computed by ASE's EMT
calculator, and their edges (atom pairs closer than a cutoff).

    python -m ddstore_bench.gnn generate --out DIR [--samples N] [--seed S]
        [--cutoff 3.0] [--format flat|files|both]

Structure i of seed s is made by ``numpy.random.default_rng([s, i])`` alone
(:func:`structure`), so any subset can be produced in any order. Half of
the structures (by a coin of that generator) are clusters, half bulk cells,
each of one of EMT's seven metals (Al, Ni, Cu, Pd, Ag, Pt, Au) with up to a
quarter of its atoms swapped for a second metal:

* a cluster: the atoms of the metal's fcc lattice (ASE's lattice constant,
  scaled by U(0.97, 1.03)) within a sphere around a random point, the
  radius drawn so that it holds 8 to 256 atoms; free boundaries;
* a bulk cell: the cubic fcc cell repeated (a, b, c) times, a, b, c in
  1..4 with 8 <= 4abc <= 256, strained by U(0.97, 1.03) per axis;
  periodic boundaries.

Every atom is then displaced by N(0, 0.05^2) Angstrom per axis. Edges are
the ordered pairs (i, j), i != j, closer than the cutoff (3.0 Angstrom by
default; across periodic boundaries for bulk cells, with ASE's neighbour
list), with their lengths.

Fields of a structure of n atoms and e edges:

    z           (n,)    uint8    atomic numbers
    pos         (n, 3)  float32  positions, Angstrom
    forces      (n, 3)  float32  EMT forces, eV/Angstrom
    edge_index  (e, 2)  int32    pairs of atom indices within the structure
    dist        (e,)    float32  edge lengths, Angstrom
    energy      ()      float64  EMT energy, eV

Files written under DIR (:func:`generate`):

* ``DIR/gnn.h5``: the usual flat layout of ragged data: every field's
  rows of all structures concatenated (``z``, ``pos``, ``forces`` of
  sum n rows; ``edge_index``, ``dist`` of sum e rows), with
  ``atom_offsets`` and ``edge_offsets`` (N + 1 int64 each: structure i's
  rows are [offsets[i], offsets[i+1])), and ``energy`` (N,) float64;
  attrs seed, version, samples, cutoff;
* ``DIR/files/sample_{i:06d}.h5``: one structure's fields, as data of this
  kind usually come (one file per structure); attrs seed, version, index,
  cutoff.

Files are written under a temporary name and renamed; a file whose attrs
match is reused, so a job may call generate every time.
"""

import os
import time

import numpy as np

__all__ = ["generate", "structure", "FIELDS", "ATOM_FIELDS", "EDGE_FIELDS", "VERSION", "FLAT_NAME",
           "FILES_DIR", "file_name", "FORMATS", "METALS"]

VERSION = 1
FORMATS = ("flat", "files", "both")
FLAT_NAME = "gnn.h5"
FILES_DIR = "files"
METALS = ("Al", "Ni", "Cu", "Pd", "Ag", "Pt", "Au")
MIN_ATOMS, MAX_ATOMS = 8, 256
ATOM_FIELDS = {"z": ((), np.uint8), "pos": ((3,), np.float32), "forces": ((3,), np.float32)}
EDGE_FIELDS = {"edge_index": ((2,), np.int32), "dist": ((), np.float32)}
FIELDS = dict(ATOM_FIELDS, **EDGE_FIELDS)


def file_name(i):
    """Name of structure i's own file under DIR/files."""
    return f"sample_{i:06d}.h5"


def _check(samples, seed, cutoff, fmt):
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
        raise ValueError(f"samples = {samples!r}: want an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed = {seed!r}: want an integer >= 0")
    if not isinstance(cutoff, (int, float)) or not 1.0 <= cutoff <= 8.0:
        raise ValueError(f"cutoff = {cutoff!r}: want a length in Angstrom between 1 and 8")
    if fmt not in FORMATS:
        raise ValueError(f"format = {fmt!r}: want one of {', '.join(FORMATS)}")
    return int(samples), int(seed), float(cutoff), fmt


def _fcc(metal):
    from ase.data import atomic_numbers, reference_states
    return reference_states[atomic_numbers[metal]]["a"]


def _atoms(rng):
    from ase import Atoms
    from ase.build import bulk
    metal = METALS[rng.integers(len(METALS))]
    a0 = _fcc(metal) * rng.uniform(0.97, 1.03)
    if rng.random() < 0.5:
        # A cluster: the lattice's sites within a sphere. The fcc lattice
        # holds 4/a^3 sites per volume; draw the count, derive the radius.
        want = int(rng.integers(MIN_ATOMS, MAX_ATOMS + 1))
        r = (3 * want * a0 ** 3 / (16 * np.pi)) ** (1 / 3)
        k = int(np.ceil(r / a0)) + 1
        cell = bulk(metal, "fcc", a=a0, cubic=True).repeat((2 * k, 2 * k, 2 * k))
        centre = cell.cell.lengths() / 2 + rng.uniform(-0.5, 0.5, 3) * a0
        d = np.linalg.norm(cell.positions - centre, axis=1)
        keep = np.argsort(d, kind="stable")[:want]
        atoms = Atoms(cell.numbers[keep], positions=cell.positions[keep] - centre, pbc=False)
    else:
        while True:
            reps = rng.integers(1, 5, 3)
            if MIN_ATOMS <= 4 * reps.prod() <= MAX_ATOMS:
                break
        atoms = bulk(metal, "fcc", a=a0, cubic=True).repeat(tuple(int(x) for x in reps))
        atoms.set_cell(atoms.cell * rng.uniform(0.97, 1.03, 3)[:, None], scale_atoms=True)
    n = len(atoms)
    other = METALS[rng.integers(len(METALS))]
    swap = rng.random(n) < rng.uniform(0, 0.25)
    numbers = atoms.numbers.copy()
    from ase.data import atomic_numbers
    numbers[swap] = atomic_numbers[other]
    atoms.numbers = numbers
    atoms.positions = atoms.positions + rng.normal(0, 0.05, (n, 3))
    return atoms


def structure(seed, i, cutoff=3.0):
    """Structure i of seed as a dict of its fields (see the module's doc)."""
    from ase.calculators.emt import EMT
    from ase.neighborlist import neighbor_list
    atoms = _atoms(np.random.default_rng([seed, i]))
    atoms.calc = EMT()
    energy = float(atoms.get_potential_energy())
    forces = atoms.get_forces()
    src, dst, d = neighbor_list("ijd", atoms, cutoff)
    order = np.lexsort((dst, src))
    return {
        "z": atoms.numbers.astype(np.uint8),
        "pos": atoms.positions.astype(np.float32),
        "forces": forces.astype(np.float32),
        "edge_index": np.stack([src[order], dst[order]], axis=1).astype(np.int32),
        "dist": d[order].astype(np.float32),
        "energy": np.float64(energy),
    }


def _attrs(seed, samples, cutoff):
    return {"seed": seed, "version": VERSION, "samples": samples, "cutoff": cutoff}


def _file_attrs(seed, i, cutoff):
    return {"seed": seed, "version": VERSION, "index": i, "cutoff": cutoff}


def _matches(path, want):
    import h5py
    try:
        with h5py.File(path, "r") as f:
            return all(k in f.attrs and f.attrs[k] == v for k, v in want.items())
    except (OSError, KeyError, ValueError):
        return False


def _tmp(path):
    return f"{path}.tmp-{os.getpid()}"


def generate(out, samples, seed=0, cutoff=3.0, fmt="both", verbose=True):
    """Write the dataset under the directory out (see the module's doc); return
    {"flat": DIR/gnn.h5, "files": [DIR/files/sample_000000.h5, ...]} with the
    keys of the formats asked for. Files already there with the same attrs
    are reused."""
    import h5py
    samples, seed, cutoff, fmt = _check(samples, seed, cutoff, fmt)
    log = (lambda *a: print(*a, flush=True)) if verbose else (lambda *a: None)
    os.makedirs(out, exist_ok=True)
    paths = {}
    flat = None
    if fmt in ("flat", "both"):
        paths["flat"] = os.path.join(out, FLAT_NAME)
        if _matches(paths["flat"], _attrs(seed, samples, cutoff)):
            log(f"gnn generate: {paths['flat']} exists with the same attrs; generation skipped")
        else:
            flat = paths["flat"]
    todo_files = set()
    if fmt in ("files", "both"):
        fdir = os.path.join(out, FILES_DIR)
        os.makedirs(fdir, exist_ok=True)
        paths["files"] = [os.path.join(fdir, file_name(i)) for i in range(samples)]
        todo_files = {i for i, p in enumerate(paths["files"]) if not _matches(p, _file_attrs(seed, i, cutoff))}
        keep = {os.path.basename(p) for p in paths["files"]}
        for n in os.listdir(fdir):
            if n.startswith("sample_") and n.endswith(".h5") and n not in keep:
                os.unlink(os.path.join(fdir, n))
    todo = sorted(set(range(samples) if flat else ()) | todo_files)
    if not todo:
        return paths
    log(f"gnn generate: computing {len(todo)} structures (EMT), seed {seed}, cutoff {cutoff} A, into {out}")
    t0 = last = time.perf_counter()
    parts = {k: [] for k in FIELDS} if flat else None
    energies = np.zeros(samples, np.float64)
    try:
        for n, i in enumerate(todo):
            s = structure(seed, i, cutoff)
            if flat:
                for k in FIELDS:
                    parts[k].append(s[k])
                energies[i] = s["energy"]
            if i in todo_files:
                p = paths["files"][i]
                with h5py.File(_tmp(p), "w") as g:
                    g.attrs.update(_file_attrs(seed, i, cutoff))
                    for k, v in s.items():
                        g.create_dataset(k, data=v)
                os.replace(_tmp(p), p)
            now = time.perf_counter()
            if now - last >= 5.0 or n + 1 == len(todo):
                last = now
                log(f"gnn generate: {n + 1}/{len(todo)} structures, {now - t0:.1f} s")
        if flat:
            with h5py.File(_tmp(flat), "w") as f:
                f.attrs.update(_attrs(seed, samples, cutoff))
                for k in FIELDS:
                    f.create_dataset(k, data=np.concatenate(parts[k]))
                for name, key in (("atom_offsets", "z"), ("edge_offsets", "dist")):
                    f.create_dataset(name, data=np.concatenate([[0], np.cumsum([len(x) for x in parts[key]])])
                                     .astype(np.int64))
                f.create_dataset("energy", data=energies)
            os.replace(_tmp(flat), flat)
    finally:
        for p in ([flat] if flat else []) + [paths["files"][i] for i in todo_files]:
            if os.path.exists(_tmp(p)):
                os.unlink(_tmp(p))
    log(f"gnn generate: done in {time.perf_counter() - t0:.1f} s")
    return paths


def read_flat(path):
    """The flat file's fields as numpy arrays (offsets included)."""
    import h5py
    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in f.keys()}


def read_file(path):
    """One structure's file as a dict of its fields."""
    import h5py
    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in f.keys()}
