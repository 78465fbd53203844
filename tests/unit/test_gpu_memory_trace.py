"""benchmarks/gpu_memory_trace.py's replay of CUDA's allocator history (the tracing itself needs a GPU): the peak is
the largest total of blocks live at once, and its blocks are grouped by the code that allocated them."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

import gpu_memory_trace  # benchmarks/ is not a package: found through sys.path above

MASK = [{"filename": "/tmp/site/unsloth/models/_attn_mask_compat.py", "line": 200, "name": "_unmask_unattended"}]
SDPA = [{"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"},
        {"filename": "/tmp/site/unsloth/utils/attention_dispatch.py", "line": 99, "name": "scaled_dot_product_attention"}]


def alloc(addr, size, frames):
    return {"action": "alloc", "addr": addr, "size": size, "frames": frames}


def free(addr):
    return {"action": "free_requested", "addr": addr}


def test_the_peak_is_the_largest_live_total_and_a_freed_block_leaves_it():
    events = [alloc(1, 100, MASK), alloc(2, 50, SDPA), free(2), alloc(3, 30, SDPA), alloc(4, 10, SDPA), free(4),
              free(1), alloc(5, 500, MASK), free(5)]
    peak, blocks = gpu_memory_trace.live_at_peak(events)
    assert peak == 530 and [b["addr"] for b in blocks] == [3, 5]  # 3 is still live beside 5
    peak, blocks = gpu_memory_trace.live_at_peak(events[:7])
    assert peak == 150 and [b["addr"] for b in blocks] == [1, 2]


def test_a_block_allocated_before_the_trace_does_not_count_when_freed():
    peak, blocks = gpu_memory_trace.live_at_peak([free(9), alloc(1, 40, MASK), alloc(2, 20, MASK)])
    assert peak == 60 and len(blocks) == 2


def test_blocks_are_grouped_by_their_allocating_code_largest_first_without_torchs_own_frames():
    sites = gpu_memory_trace.by_frames([alloc(1, 30, SDPA), alloc(2, 100, MASK), alloc(3, 40, SDPA)])
    assert sites == [("unsloth/models/_attn_mask_compat.py:200(_unmask_unattended)", 100, 1),
                     ("unsloth/utils/attention_dispatch.py:99(scaled_dot_product_attention)", 70, 2)]
