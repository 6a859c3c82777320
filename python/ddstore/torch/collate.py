"""Collation of samples whose fields vary in size: Packed (values
concatenated, with offsets), Padded (padded to the longest, with lengths)
and Graphs (PyTorch Geometric's convention: node and edge fields
concatenated, a batch vector, edge indices shifted per graph).

Each is a collate_fn: it takes a list of samples, from any dataset, in
torch's DataLoader (forked workers too) or in ThreadDataLoader. Over a
DistDataset or DistDatasetReader, ThreadDataLoader hands it the batch as
read (one get_ragged per ragged field, one get_batch per fixed one) instead
of samples, so nothing is cut into samples and joined again; the result is
the same.

Which fields are ragged, and along which axis: over a dataset of this
package, its schema says (pass ds= when the collate runs in torch's
DataLoader, which gives it samples only); otherwise `ragged` names them
({key: axis} or a list of keys, axis 0), else a field whose shape differs
within the batch is ragged along the one axis that differs, and one that
does not is fixed. str and bytes fields come back as lists.

    loader = ThreadDataLoader(ds, batch_size=64, collate_fn=Graphs(edges={"edge_index": "x"}))
    for g in loader:   # g["x"] [sum n, F], g["edge_index"] [2, sum e] shifted, g["batch"] [sum n], g["ptr"] [65]
        ...
"""

import numpy as np
import torch

from .._errors import ArgumentError, ArgumentTypeError
from ._schema import WindowValues, _items

__all__ = ["Packed", "Padded", "Graphs"]


class _Col:
    """One field of a batch: fixed (data: a tensor [B, *shape]), ragged
    (data: the rows' units concatenated, [sum, *trailing], the varying axis
    first; lengths: int64 numpy [B]; axis: where the varying axis goes back
    in a sample), or str/bytes (data: a list)."""

    __slots__ = ("key", "layout", "axis", "data", "lengths")

    def __init__(self, key, layout, data, lengths=None, axis=0):
        self.key, self.layout, self.data, self.lengths, self.axis = key, layout, data, lengths, axis

    def offsets(self):
        off = torch.zeros(self.lengths.shape[0] + 1, dtype=torch.int64)
        torch.cumsum(torch.from_numpy(np.ascontiguousarray(self.lengths, np.int64)), 0, out=off[1:])
        return off

    def sample_oriented(self):
        """A ragged field's values concatenated along its own axis."""
        return self.data.movedim(0, self.axis).contiguous() if self.axis else self.data


def _cols_of_arrays(schema, arrays, device):
    cols = []
    for f, a in zip(schema.fields, arrays):
        if f.layout == "fixed":
            cols.append(_Col(f.key, "fixed", f.tensor(a, device)))
        elif f.layout == "ragged":
            values, lengths = a
            cols.append(_Col(f.key, "ragged", f.tensor(values, device), np.asarray(lengths, np.int64), f.axis or 0))
        else:
            values, lengths = a
            off = np.zeros(len(lengths) + 1, np.int64)
            np.cumsum(lengths, out=off[1:])
            cols.append(_Col(f.key, f.layout, [f.unit_value(values[off[j]:off[j + 1]], None)
                                               for j in range(len(lengths))]))
    return cols


def _window_rows(kind, samples, w):
    """The rows of window samples (of a schema of this kind; each field w
    rows stacked, or a list of w values), window after window."""
    rows = []
    for s in samples:
        if kind in ("tensor", "bare"):
            rows.extend(s[k] for k in range(w))
            continue
        _, items = _items(s)
        for k in range(w):
            vals = [v[k] for _, v in items]
            rows.append(dict(zip((key for key, _ in items), vals)) if kind == "dict" else
                        tuple(vals) if kind == "tuple" else vals)
    return rows


def _plain_window_rows(samples):
    """The rows of windows of a dataset not of this package (WindowedDataset)
    when the first holds WindowValues (its fields vary in shape), else
    None."""
    s0 = samples[0]
    if isinstance(s0, WindowValues):  # bare samples
        return [r for s in samples for r in s]
    kind, items = _items(s0)
    lens = [len(v) for _, v in items if isinstance(v, WindowValues)]
    if not lens:
        return None
    return _window_rows(kind, samples, lens[0])


def _numpy(t):
    """A CPU tensor's numpy view (no copy), None for one numpy cannot hold
    (on a device, bfloat16, needing grad)."""
    if t.device.type != "cpu" or t.dtype == torch.bfloat16 or t.requires_grad:
        return None
    try:
        return t.numpy()
    except (TypeError, RuntimeError):
        return None


def _on(t, device):
    return t if device.type == "cpu" else t.to(device)


def _as_tensor(v):
    if isinstance(v, torch.Tensor):
        return v
    return torch.as_tensor(np.asarray(v))


class _Collate:
    """What the collates share: the batch's fields as _Col, from samples or
    from the arrays a dataset of this package read."""

    def __init__(self, ragged=None, ds=None):
        if ragged is None:
            self.ragged = {}
        elif isinstance(ragged, dict):
            self.ragged = dict(ragged)
        elif isinstance(ragged, (list, tuple)):
            self.ragged = {k: 0 for k in ragged}
        else:
            raise ArgumentTypeError(f"ddstore: bad argument: ragged of type {type(ragged).__name__}: want a dict "
                                    f"field key -> varying axis, or a list of keys")
        schema = getattr(ds, "_schema", None) if ds is not None else None
        # A dataset whose samples are decoded is not of its stored schema.
        self._schema = schema if schema is not None and getattr(ds, "decode", None) is None else None
        # A WindowedDataset with fields of varying size: its window samples
        # are collated as the batch of their rows, window after window.
        self._window = getattr(ds, "_ddstore_window", None) if ds is not None else None
        if self._window is not None:
            self._schema, self._window_len = self._window, ds.window

    def __call__(self, samples):
        if not isinstance(samples, (list, tuple)) or not samples:
            raise ArgumentError(f"ddstore: bad argument: {type(self).__name__}: a batch of "
                                f"{len(samples) if hasattr(samples, '__len__') else '?'} samples: want a non-empty "
                                f"list of samples")
        if self._window is not None:
            samples = _window_rows(self._window.kind, samples, self._window_len)
        else:
            samples = _plain_window_rows(samples) or samples
        kind, items = _items(samples[0])
        keys = [k for k, _ in items]
        cols = []
        for pos, key in enumerate(keys):
            vals = []
            for j, s in enumerate(samples):
                k2, it = _items(s)
                if k2 != kind or len(it) != len(items) or it[pos][0] != key:
                    raise ArgumentError(f"ddstore: bad argument: {type(self).__name__}: sample {j} of the batch "
                                        f"({k2}, fields {[k for k, _ in it]}) differs from sample 0 ({kind}, fields "
                                        f"{keys})")
                vals.append(it[pos][1])
            cols.append(self._col_of_values(key, vals))
        return self._collate(kind, keys, cols)

    def _ddstore_batch(self, schema, arrays, device):
        """The batch from a dataset's per-field arrays (see _schema)."""
        return self._collate(schema.kind, [f.key for f in schema.fields], _cols_of_arrays(schema, arrays, device))

    def _col_of_values(self, key, vals):
        first = vals[0]
        if isinstance(first, (str, bytes)):
            layout = "str" if isinstance(first, str) else "bytes"
            for j, v in enumerate(vals):
                if not isinstance(v, type(first)):
                    raise ArgumentTypeError(f"ddstore: bad argument: field {key!r} of sample {j} of the batch: a "
                                            f"{type(v).__name__}, sample 0 has {layout}")
            return _Col(key, layout, list(vals))
        ts = [_as_tensor(v) for v in vals]
        t0 = ts[0]
        for j, t in enumerate(ts):
            if t.dtype != t0.dtype or t.dim() != t0.dim():
                raise ArgumentError(f"ddstore: bad argument: field {key!r} of sample {j} of the batch: {t.dtype} of "
                                    f"shape {tuple(t.shape)}, sample 0 has {t0.dtype} of shape {tuple(t0.shape)}: "
                                    f"want one dtype and rank")
        axis = None
        f = self._schema.by_key.get(key) if self._schema is not None else None
        if f is not None:
            axis = f.axis if f.layout == "ragged" else None
        elif key in self.ragged:
            axis = self.ragged[key]
        else:
            differ = sorted({d for t in ts[1:] for d in range(t.dim()) if t.shape[d] != t0.shape[d]})
            if len(differ) > 1:
                raise ArgumentError(f"ddstore: bad argument: field {key!r}: shapes {tuple(t0.shape)}, ... differ "
                                    f"in axes {differ} within the batch: want one varying axis")
            axis = differ[0] if differ else None
        if axis is None:
            return _Col(key, "fixed", torch.stack(ts))
        if not 0 <= axis < t0.dim():
            raise ArgumentError(f"ddstore: bad argument: field {key!r}: axis {axis} of a {t0.dim()}-d field")
        lengths = np.array([t.shape[axis] for t in ts], np.int64)
        data = torch.cat([t.movedim(axis, 0) if axis else t for t in ts])
        return _Col(key, "ragged", data, lengths, axis)

    @staticmethod
    def _pack(kind, keys, outs):
        if kind in ("tensor", "bare"):
            return outs[0]
        if kind == "dict":
            return dict(zip(keys, outs))
        return list(outs)  # a tuple's fields as a list, as default_collate


class Packed(_Collate):
    """Fixed fields stacked ([B, *shape], as default_collate); a ragged
    field as (values, offsets): its samples concatenated along their
    varying axis and the int64 offsets [B + 1] where sample j's part is
    values[offsets[j]:offsets[j+1]] along that axis; str and bytes fields
    as lists. The default of ThreadDataLoader over a dataset with ragged
    fields."""

    def _collate(self, kind, keys, cols):
        outs = []
        for c in cols:
            if c.layout == "ragged":
                outs.append((c.sample_oriented(), c.offsets()))
            else:
                outs.append(c.data)
        return self._pack(kind, keys, outs)


class Padded(_Collate):
    """A ragged field padded to the batch's longest sample with `value`:
    (padded, lengths), padded of shape [B, *sample shape] with the varying
    axis as long as the longest, lengths int64 [B]; fixed fields stacked;
    str and bytes fields as lists."""

    def __init__(self, value=0, ragged=None, ds=None):
        super().__init__(ragged, ds)
        self.value = value

    def _collate(self, kind, keys, cols):
        outs = []
        for c in cols:
            if c.layout != "ragged":
                outs.append(c.data)
                continue
            b = c.lengths.shape[0]
            longest = int(c.lengths.max()) if b else 0
            out = torch.full((b, longest, *c.data.shape[1:]), self.value, dtype=c.data.dtype, device=c.data.device)
            lengths = torch.from_numpy(np.ascontiguousarray(c.lengths, np.int64))
            if c.data.shape[0]:
                rows = torch.repeat_interleave(torch.arange(b), lengths)
                starts = c.offsets()[:-1]
                pos = torch.arange(c.data.shape[0]) - torch.repeat_interleave(starts, lengths)
                out[rows.to(out.device), pos.to(out.device)] = c.data
            if c.axis:
                out = out.movedim(1, c.axis + 1).contiguous()
            outs.append((out, lengths))
        return self._pack(kind, keys, outs)


class Graphs(_Collate):
    """Dict samples of graphs into one disjoint graph, as PyTorch
    Geometric batches them (without depending on it): every tensor field
    concatenated, along its varying axis when it is ragged, else along
    axis 0 (along the last axis for edge fields; 0-d fields stacked); str
    and bytes fields as lists.

    edges: {edge field: node field it indexes}, e.g. {"edge_index": "x"}:
    graph j's edge indices are shifted by the nodes of the graphs before it
    (counted along the node field's axis 0), so that they index the batch's
    nodes. nodes: the field that counts nodes for the batch vector (default:
    the first node field of edges, else the first ragged field). Adds
    batch (int64 [sum n], graph of each node) and ptr (int64 [B + 1], where
    each graph's nodes start) under the names given (None: left out)."""

    def __init__(self, edges=None, nodes=None, batch="batch", ptr="ptr", ragged=None, ds=None):
        super().__init__(ragged, ds)
        if isinstance(edges, str):
            raise ArgumentTypeError(f"ddstore: bad argument: Graphs: edges {edges!r}: want a dict edge field -> the "
                                    f"node field it indexes, e.g. {{{edges!r}: 'x'}}")
        self.edges = dict(edges or {})
        self.nodes, self.batch_key, self.ptr_key = nodes, batch, ptr
        self._fast = None  # (schema, _fast_keys(schema)) of the last batch

    def _ddstore_batch(self, schema, arrays, device):
        """The batch from a dataset's per-field arrays: for a schema of
        numpy-held fields in CPU memory whose edge and node fields are
        ragged (a graph dataset's), straight from the arrays in numpy,
        what _collate makes of them with none of its per-field tensor
        round trips and checks (made once per schema); else _collate.
        (str and bytes fields as lists, as there.)"""
        fast = self._fast
        if fast is None or fast[0] is not schema:
            fast = self._fast = (schema, self._fast_keys(schema))
        keys = fast[1]
        if keys is None or device is not None:
            return super()._ddstore_batch(schema, arrays, device)
        lens = {}
        for f, a in zip(schema.fields, arrays):
            if f.layout == "ragged":
                if type(a[0]) is not np.ndarray:
                    return super()._ddstore_batch(schema, arrays, device)
                lens[f.key] = np.asarray(a[1], np.int64)
        edges = self.edges
        out = {}
        for f, a in zip(schema.fields, arrays):
            k = f.key
            if f.layout in ("str", "bytes"):
                values, lengths = a
                off = np.zeros(len(lengths) + 1, np.int64)
                np.cumsum(lengths, out=off[1:])
                off = off.tolist()
                out[k] = [f.unit_value(values[off[j]:off[j + 1]], None) for j in range(len(lengths))]
                continue
            if f.layout == "ragged":
                dim = f.axis or 0
                a = a[0]
                src = np.moveaxis(a, 0, dim) if dim else a
            elif a.ndim == 1:  # 0-d per graph: one value each
                dim, src = 0, a
            else:  # graphs' rows one after the other (an edge field is ragged here)
                dim, src = 0, a.reshape(-1, *a.shape[2:])
            if k not in edges:
                out[k] = torch.from_numpy(np.ascontiguousarray(src))
                continue
            out[k] = torch.from_numpy(_shifted(src, dim, lens[edges[k]], lens[k]))
        self._batch_ptr(out, lens[keys], None)
        return out

    def _fast_keys(self, schema):
        """The node field of _ddstore_batch's numpy path over schema, or
        None where _collate must batch it (other samples than dicts,
        bfloat16 fields, a fixed edge or node field, names
        that _collate refuses: it then says what is wrong)."""
        if schema.kind != "dict":
            return None
        by = {f.key: f for f in schema.fields}
        for f in schema.fields:
            if f.layout not in ("fixed", "ragged", "str", "bytes") or f.dtype == "bfloat16":
                return None
        for e, nk in self.edges.items():
            if by.get(e) is None or by.get(nk) is None or by[e].layout != "ragged" or by[nk].layout != "ragged":
                return None
        for k in (self.batch_key, self.ptr_key):
            if k is not None and k in by:
                return None
        node_key = self._node_key(f.key for f in schema.fields if f.layout == "ragged")
        if node_key is None or node_key not in by or by[node_key].layout != "ragged":
            return None
        return node_key

    def _node_key(self, ragged_keys):
        """The field that counts a graph's nodes: nodes=, else the node
        field of the first edge field, else the first ragged field (or
        None)."""
        node_key = self.nodes
        if node_key is None:
            node_key = next(iter(self.edges.values()), None)
        if node_key is None:
            node_key = next(iter(ragged_keys), None)
        return node_key

    def _batch_ptr(self, out, n, device):
        """The batch vector and ptr of graphs of n nodes each (int64
        numpy), into out under their names (None: left out), on device
        (None: CPU)."""
        on = (lambda t: t) if device is None else (lambda t: _on(t, device))
        if self.batch_key is not None:
            out[self.batch_key] = on(torch.from_numpy(_runs(np.arange(n.shape[0], dtype=np.int64), n)))
        if self.ptr_key is not None:
            ptr = np.zeros(n.shape[0] + 1, np.int64)
            np.cumsum(n, out=ptr[1:])
            out[self.ptr_key] = on(torch.from_numpy(ptr))

    def _collate(self, kind, keys, cols):
        if kind != "dict":
            raise ArgumentTypeError(f"ddstore: bad argument: Graphs: samples of kind {kind}: want dict samples "
                                    f"(field name -> value)")
        by = {c.key: c for c in cols}
        for e, n in self.edges.items():
            for what, k in (("edge field", e), ("node field", n)):
                if k not in by:
                    raise ArgumentError(f"ddstore: bad argument: Graphs: {what} {k!r} not in the samples' fields "
                                        f"{keys}")
        for k in (self.batch_key, self.ptr_key):
            if k is not None and k in by:
                raise ArgumentError(f"ddstore: bad argument: Graphs: the samples have a field {k!r}, the name of "
                                    f"the batch's {'batch vector' if k == self.batch_key else 'ptr'}: pass "
                                    f"batch=/ptr= another name")
        counts = {}

        def count(k):
            """Per graph, the size of field k along its concatenation axis."""
            if k not in counts:
                c = by[k]
                if c.layout == "ragged":
                    counts[k] = torch.from_numpy(np.ascontiguousarray(c.lengths, np.int64))
                elif c.layout == "fixed" and c.data.dim() > 1:
                    d = c.data.shape[-1] if k in self.edges else c.data.shape[1]
                    counts[k] = torch.full((c.data.shape[0],), d, dtype=torch.int64)
                else:
                    raise ArgumentError(f"ddstore: bad argument: Graphs: field {k!r} counts nothing per graph "
                                        f"({c.layout}{'' if c.layout != 'fixed' else ' 0-d'})")
            return counts[k]

        outs = []
        for c in cols:
            if c.layout in ("str", "bytes"):
                outs.append(c.data)
                continue
            a = _numpy(c.data)
            if a is not None:
                # A field in CPU memory: moved and shifted in numpy, one pass
                # into one new array (or the values themselves). Torch's
                # element-wise kernels would split a batch's few thousand
                # rows over its intra-op threads, which on a busy machine
                # wait on one another longer than the work takes.
                outs.append(torch.from_numpy(self._joined(c, a, count)))
                continue
            if c.layout == "ragged":
                t = c.sample_oriented()
                dim = c.axis
            elif c.data.dim() == 1:  # 0-d per graph: one value each
                t, dim = c.data, 0
            else:
                dim = c.data.dim() - 2 if c.key in self.edges else 0
                t = c.data.movedim(0, dim)
                t = t.reshape(*t.shape[:dim], -1, *t.shape[dim + 2:])
            if c.key in self.edges:
                nodes = count(self.edges[c.key])
                shift = torch.cumsum(nodes, 0) - nodes
                per = torch.repeat_interleave(shift, count(c.key)).to(device=t.device, dtype=t.dtype)
                t = t + per.reshape(-1, *([1] * (t.dim() - dim - 1)))
            outs.append(t)
        out = dict(zip(keys, outs))
        node_key = self._node_key(c.key for c in cols if c.layout == "ragged")
        if node_key is None and (self.batch_key is not None or self.ptr_key is not None):
            raise ArgumentError("ddstore: bad argument: Graphs: no field counts nodes (no edges, nodes or ragged "
                                "field): pass nodes=")
        if node_key is not None and (self.batch_key is not None or self.ptr_key is not None):
            if node_key not in by:
                raise ArgumentError(f"ddstore: bad argument: Graphs: node field {node_key!r} not in the samples' "
                                    f"fields {keys}")
            self._batch_ptr(out, count(node_key).numpy(), by[node_key].data.device)
        return out

    def _joined(self, c, a, count):
        """Field c (a: its data as numpy) as the batch holds it, what the
        torch path of _collate makes: the graphs' parts concatenated along
        the field's axis (a ragged field's own; an edge field's last but
        one, else 0), an edge field's indices shifted by the nodes of the
        graphs before each."""
        edge = c.key in self.edges
        if c.layout == "ragged":
            dim = c.axis
            src = np.moveaxis(a, 0, dim) if dim else a
        elif a.ndim == 1:  # 0-d per graph: one value each
            dim, src = 0, a
        else:
            dim = a.ndim - 2 if edge else 0
            src = np.moveaxis(a, 0, dim)
            src = src.reshape(*src.shape[:dim], -1, *src.shape[dim + 2:])
        if not edge:
            return np.ascontiguousarray(src)
        return _shifted(src, dim, count(self.edges[c.key]).numpy(), count(c.key).numpy())


def _shifted(src, dim, nodes, edges):
    """An edge field's values src (its graphs' parts joined along dim) as a
    new array with each graph's indices shifted by the nodes of the graphs
    before it (nodes, edges: per graph, int64 numpy)."""
    shift = (np.cumsum(nodes) - nodes).astype(src.dtype, copy=False)
    per = _runs(shift, edges).reshape(-1, *([1] * (src.ndim - dim - 1)))
    out = np.empty(src.shape, src.dtype)
    np.add(src, per, out=out)
    return out


# The mean run above which _runs fills slices: numpy's repeat copies item
# by item (about 2 ns an item), a slice fill costs about 0.3 us a run.
_RUN_FILL = 128


def _runs(values, counts):
    """np.repeat(values, counts) of a 1-d values and int64 counts >= 0:
    with long runs (a batch's graphs of hundreds of nodes and edges) one
    slice fill a run, several times faster than np.repeat."""
    total = int(counts.sum())
    if counts.shape[0] * _RUN_FILL > total:
        return np.repeat(values, counts)
    out = np.empty(total, values.dtype)
    p = 0
    for v, k in zip(values.tolist(), counts.tolist()):
        q = p + k
        out[p:q] = v
        p = q
    return out

