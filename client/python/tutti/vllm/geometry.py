"""The geometry of vLLM's KV cache, from the tensors a worker registers (register_kv_caches) and
the KVCacheConfig's spec: tutti's KvLayout, the object placements of every (layer, part), the
physical order of the dimensions and the order inside a block (which goes into the namespace).

Pure: reads shapes, strides, element sizes, data pointers and devices; copies nothing. What it
accepts (per layer, all layers alike):
- packed (current vLLM): a [blocks, heads, tokens, 2 * head_size] view (K and V packed in the
  content dimension) in any physical order in which one layer's block (heads x tokens x content)
  is one dense region: KV_FORMAT_PACKED, head_dim = 2 * head_size. E.g. LBNHC (vLLM's default),
  LBHNC, BLNHC, BLHNC. An order that puts the layers inside a block (e.g. BNLHC) is refused.
- fused: [2, blocks, tokens, heads, head_size] (vLLM before the packed layout), or
  [blocks, 2, tokens, heads, head_size] (K and V at an offset in each block): KV_FORMAT_FUSED,
  two objects per layer; tokens and heads may be in either order (NHD, HND) if dense.
- mla: [blocks, tokens, latent]: KV_FORMAT_MLA, kv_heads 1, head_dim = latent.
Everything else raises ValueError naming the layer, its shape and strides and what is supported.
"""

import re
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from tutti.layout import KvLayout, ObjectTensor

SUPPORTED = ("supported per layer: [blocks, heads, tokens, 2*head_size] whose heads, tokens and "
             "content dims are dense within a block (orders LBNHC, LBHNC, BLNHC, BLHNC), "
             "[2, blocks, tokens, heads, head_size], [blocks, 2, tokens, heads, head_size], "
             "MLA [blocks, tokens, latent]")


@dataclass(frozen=True)
class Geometry:
    layout: KvLayout
    order: str                 # physical order, outermost first, e.g. "LBNHC", "2BNHD", "B2NHD"
    in_block: str              # order inside one object, e.g. "NHC", "HNC", "NHD", "NL" (mla)
    dtype: str                 # e.g. "bfloat16"
    layer_names: Tuple[str, ...]  # in layer order (layer l of the layout)
    num_blocks: int
    objects: Tuple[ObjectTensor, ...]  # layer-major, parts per layer (Client.attach's objects)
    device: Optional[int]      # the CUDA device index, None for host memory

    def layer_index(self, name: str) -> int:
        """The layout's layer of vLLM layer `name`; raises KeyError for an unknown name."""
        return self.layer_names.index(name)


def _dims(t):
    return tuple(int(s) for s in t.shape), tuple(int(s) for s in t.stride())


def _dense_order(names, sizes, strides, canonical):
    """The order (outermost first) of dims `names` if they tile one dense region, else None.
    Dims of size 1 have no order of their own: they take their place in `canonical`."""
    big = [i for i, s in enumerate(sizes) if s > 1]
    expected = 1
    for i in sorted(big, key=lambda i: strides[i]):
        if strides[i] != expected:
            return None
        expected *= sizes[i]
    by_stride = sorted(big, key=lambda i: -strides[i])
    slots = [j for j, n in enumerate(canonical) if names.index(n) in big]
    out = list(canonical)
    for slot, i in zip(slots, by_stride):
        out[slot] = names[i]
    return "".join(out)


def _layer_sort_key(item):
    position, name = item
    ints = re.findall(r"\d+", name)
    return (int(ints[0]) if len(ints) == 1 else position, position)


def _spec_of(kv_cache_config, names):
    """The spec of the one KV cache group that holds `names` (derive's single-group path)."""
    if kv_cache_config is None or not getattr(kv_cache_config, "kv_cache_groups", None):
        return None
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ValueError("the KV cache has %d groups (a hybrid model): derive each group's "
                         "layers with derive_groups" % len(groups))
    spec = groups[0].kv_cache_spec
    missing = [n for n in names if n not in groups[0].layer_names]
    if missing:
        raise ValueError("layers %s are not in the KV cache group %s" % (missing[:4],
                                                                        groups[0].layer_names[:4]))
    return spec


def _refuse(name, shape, strides, why):
    raise ValueError("KV cache of layer %s: shape %s, strides %s (elements): %s; %s" %
                     (name, list(shape), list(strides), why, SUPPORTED))


def _packed(name, t, shape, strides, spec):
    _, heads, tokens, width = shape
    if spec is not None and (heads, tokens, width) != (spec.num_kv_heads, spec.block_size,
                                                       2 * spec.head_size):
        _refuse(name, shape, strides, "the spec says heads %d, tokens %d, 2*head_size %d" % (
            spec.num_kv_heads, spec.block_size, 2 * spec.head_size))
    order = _dense_order("HNC", shape[1:], strides[1:], "NHC")
    if order is None:
        _refuse(name, shape, strides, "one layer's block (heads x tokens x content) is not "
                "contiguous")
    es = t.element_size()
    layout = KvLayout(0, heads, width, es, tokens, "packed")
    return layout, order, [ObjectTensor(t.data_ptr(), strides[0] * es)], strides[0]


def _fused(name, t, shape, strides, spec, kv_first):
    inner = shape[2:]
    names = "NHD"
    if spec is not None:
        if inner == (spec.block_size, spec.num_kv_heads, spec.head_size):
            names = "NHD"
        elif inner == (spec.num_kv_heads, spec.block_size, spec.head_size):
            names = "HND"
        else:
            _refuse(name, shape, strides, "the spec says tokens %d, heads %d, head_size %d" % (
                spec.block_size, spec.num_kv_heads, spec.head_size))
    order = _dense_order(names, inner, strides[2:], "NHD")
    if order is None:
        _refuse(name, shape, strides, "one block's K (tokens x heads x head_size) is not "
                "contiguous")
    tokens, heads, dim = (inner if names == "NHD" else (inner[1], inner[0], inner[2]))
    es = t.element_size()
    kv, blocks = (0, 1) if kv_first else (1, 0)
    stride = strides[blocks] * es
    objects = [ObjectTensor(t.data_ptr(), stride),
               ObjectTensor(t.data_ptr() + strides[kv] * es, stride)]
    if stride < tokens * heads * dim * es:
        _refuse(name, shape, strides, "blocks overlap")
    return KvLayout(0, heads, dim, es, tokens, "fused"), order, objects, strides[blocks]


def _mla(name, t, shape, strides, spec):
    _, tokens, latent = shape
    if spec is not None and (tokens, latent) != (spec.block_size, spec.head_size):
        _refuse(name, shape, strides, "the MLA spec says tokens %d, latent %d" % (
            spec.block_size, spec.head_size))
    order = _dense_order("NL", shape[1:], strides[1:], "NL")
    if order is None:
        _refuse(name, shape, strides, "one block's latents are not contiguous")
    es = t.element_size()
    return (KvLayout(0, 1, latent, es, tokens, "mla"), order,
            [ObjectTensor(t.data_ptr(), strides[0] * es)], strides[0])


def _one_layer(name, t, spec, num_blocks):
    shape, strides = _dims(t)
    if len(shape) == 4:
        return _packed(name, t, shape, strides, spec) + ("",)
    if len(shape) == 5:
        kv_first = shape[0] == 2 and (shape[1] != 2 or num_blocks in (None, 2))
        if not kv_first and shape[1] != 2:
            _refuse(name, shape, strides, "a 5-dim cache needs K/V (size 2) first or second")
        return _fused(name, t, shape, strides, spec, kv_first) + ("2B" if kv_first else "B2",)
    if len(shape) == 3:
        return _mla(name, t, shape, strides, spec) + ("",)
    _refuse(name, shape, strides, "%d dims" % len(shape))


def _blocks_of(shape, kind):
    return shape[1] if kind == "2B" else shape[0]


def derive(kv_caches: Dict[str, object], kv_cache_config=None, spec=None) -> Geometry:
    """The Geometry of `kv_caches` (vLLM's register_kv_caches argument: layer name -> tensor).
    `kv_cache_config` (vLLM's KVCacheConfig, optional, one group) or `spec` (one group's
    KVCacheSpec) is checked against the shapes. Raises ValueError saying what does not fit."""
    if not kv_caches:
        raise ValueError("no KV cache tensors were registered")
    items = sorted(enumerate(kv_caches), key=_layer_sort_key)
    names = [n for _, n in items]
    if spec is None:
        spec = _spec_of(kv_cache_config, names)
    cfg_blocks = getattr(kv_cache_config, "num_blocks", None)
    first = kv_caches[names[0]]
    shape0, strides0 = _dims(first)
    objects, bases = [], []
    for name in names:
        t = kv_caches[name]
        shape, strides = _dims(t)
        if (shape, strides, t.dtype, t.device) != (shape0, strides0, first.dtype, first.device):
            raise ValueError("KV cache of layer %s: shape %s strides %s %s on %s differs from layer "
                             "%s's (%s %s %s on %s); tutti needs every layer alike" % (
                                 name, list(shape), list(strides), t.dtype, t.device, names[0],
                                 list(shape0), list(strides0), first.dtype, first.device))
        layout, in_block, objs, block_stride, kind = _one_layer(name, t, spec, cfg_blocks)
        objects.extend(objs)
        bases.append(t.data_ptr())
    num_blocks = _blocks_of(shape0, kind)
    layout = KvLayout(len(names), layout.kv_heads, layout.head_dim, layout.dtype_bytes,
                      layout.block_tokens, layout.format)
    order = _full_order(kind, in_block, bases, block_stride * first.element_size(), layout)
    device = first.device.index if first.device.type == "cuda" else None
    if first.device.type == "cuda" and device is None:
        import torch
        device = torch.cuda.current_device()
    return Geometry(layout, order, in_block, str(first.dtype).replace("torch.", ""),
                    tuple(names), num_blocks, tuple(objects), device)


def _full_order(kind, in_block, bases, block_stride_bytes, layout):
    """The physical order with the layer dim placed by how far apart the layers' bases are."""
    if kind:  # fused: per-layer tensors; the layer's place is its own business
        return "L" + kind + in_block
    layer_stride = abs(bases[1] - bases[0]) if len(bases) > 1 else None
    if layer_stride is not None and layer_stride < block_stride_bytes:
        return "BL" + in_block
    return "LB" + in_block


def derive_groups(kv_caches: Dict[str, object], kv_cache_config, block_size=None):
    """[(groups.Group, Geometry)] of every KV cache group of `kv_cache_config`: each group's
    layers (layer names -> tensors of `kv_caches`) derived alone, checked against the group's
    spec. Layers of different groups may share memory (vLLM gives layer i of every group one
    tensor: their block ids never overlap). Raises ValueError for a group the connector cannot
    serve (groups.group_of: state-space layers, unknown specs), a group's layer that was not
    registered, or a registered layer in no group."""
    from tutti.vllm import groups as kvgroups
    gs = kvgroups.groups_of(kv_cache_config, block_size)
    if not gs:
        return [(None, derive(kv_caches, kv_cache_config))]
    named = set()
    out = []
    for g in gs:
        missing = [n for n in g.layer_names if n not in kv_caches]
        if missing:
            raise ValueError("KV cache group %d (%s): layers %s were not registered" % (
                g.index, g.describe(), missing[:4]))
        if not g.layer_names:
            raise ValueError("KV cache group %d (%s) has no layers" % (g.index, g.describe()))
        named.update(g.layer_names)
        geometry = derive({n: kv_caches[n] for n in g.layer_names}, spec=g.spec)
        out.append((g, geometry))
    extra = [n for n in kv_caches if n not in named]
    if extra:
        raise ValueError("layers %s are registered but in no KV cache group" % extra[:4])
    return out
