#!/usr/bin/python3
"""`llmtrain plan` against what a run allocates and sends, over a layout matrix (dp/ZeRO stages,
tp, tp+sp, pp schedules, cp ring and Ulysses, recompute, 16-bit), rank 0 after two steps:
- state: the params, grads and optimizer bytes plan prints for rank 0 equal (within 2%; in
  practice to the byte) the peaks rank 0's allocator reports in metrics.jsonl;
- communication: the bytes per step of each mesh axis and collective in `plan --json` equal
  rank 0's counters (the dp x cp group's under dp, the tied-embedding group's under pp),
  within 0.5% or 64 bytes: the counters also hold control messages (the gradient norm and the
  non-finite flag, a few floats a step), which the plan leaves out; the ep all-to-all is within
  5% (plan assumes balanced routing). ZeRO-3's all-gathers come from a replay of Zero's hooks over
  the rank's step (under pp through the schedule's actions, which decide which units stay
  gathered from one micro-batch to the next);
- activations: plan's figure (the blocks' saved tensors at the schedule's peak in-flight
  micro-batches, plus the model's scratch) within 2% of the allocator's peak (5% under ep with
  full recompute, whose peak holds one MoE layer's received rows, as many as the routing sent);
- comm buffers: plan's estimate within 2% of the allocator's peak on every layout (ZeRO's from
  the same replay: gathered copies, gradient staging, reduce-scatters); under pp the run may hold
  one boundary tensor less than plan's bound (the executor frees a sent input gradient as soon
  as its send completes, so whether the next backward's buffer finds it still there is timing),
  and under ZB-V with ZeRO none of the three at the moment ZeRO's buffers peak;
- the concurrent peak (plan's `peak`: the activations and ZeRO's buffers held together at each
  moment of the same replay, beside the state and the fixed buffers; under ep each MoE layer's
  received rows from its forward to its weight backward) within 1% of the allocator's peak of
  all categories at once, where the sum of the categories' peaks is 1.05-1.07x on pp x ZeRO-1
  and 1.07-1.12x on ep with ZeRO."""
import json
import re
import tomllib

import harness

LAYOUTS = {  # name: (ranks, sets)
    "single": (1, []),
    "bf16": (1, ["train.precision=bf16"]),
    "dp2": (2, ["parallel.dp=2"]),
    "zero1-dp2": (2, ["parallel.dp=2", "parallel.zero_stage=1"]),
    "zero2-dp2-accum2": (2, ["parallel.dp=2", "parallel.zero_stage=2",
                             "train.global_batch_size=8"]),
    "zero2-dp2-accum2-fp16": (2, ["parallel.dp=2", "parallel.zero_stage=2",
                                  "train.global_batch_size=8", "train.precision=fp16"]),
    # 16-bit gradients (train.grad_dtype = "compute"): their buffers, staging and reductions.
    "dp2-bf16-gradc": (2, ["parallel.dp=2", "train.precision=bf16", "train.grad_dtype=compute"]),
    "zero1-dp2-bf16-gradc": (2, ["parallel.dp=2", "parallel.zero_stage=1", "train.precision=bf16",
                                 "train.grad_dtype=compute"]),
    "zero2-dp2-accum2-fp16-gradc": (2, ["parallel.dp=2", "parallel.zero_stage=2",
                                        "train.global_batch_size=8", "train.precision=fp16",
                                        "train.grad_dtype=compute"]),
    "zero3-dp2-accum2-bf16-gradc": (2, ["parallel.dp=2", "parallel.zero_stage=3",
                                        "train.global_batch_size=8", "train.precision=bf16",
                                        "train.grad_dtype=compute"]),
    "tp2-sp-dp2-bf16-gradc": (4, ["parallel.tp=2", "parallel.dp=2",
                                  "parallel.sequence_parallel=true", "train.precision=bf16",
                                  "train.grad_dtype=compute"]),
    "pp2-dp2-zero1-bf16-gradc": (4, ["parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=1",
                                     "train.precision=bf16", "train.grad_dtype=compute"]),
    "ep2-dp4-bf16-gradc": (4, ["parallel.dp=4", "parallel.ep=2", "train.precision=bf16",
                               "train.grad_dtype=compute"]),
    "pp2-dp2-zero3-bf16": (4, ["parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=3",
                               "train.precision=bf16"]),
    "zero3-dp3": (3, ["parallel.dp=3", "parallel.zero_stage=3", "train.global_batch_size=6"]),
    "zero3-dp2-accum2": (2, ["parallel.dp=2", "parallel.zero_stage=3",
                             "train.global_batch_size=8"]),
    "tp2": (2, ["parallel.tp=2", "parallel.dp=1"]),
    "tp2-sp": (2, ["parallel.tp=2", "parallel.dp=1", "parallel.sequence_parallel=true"]),
    "tp2-sp-bf16": (2, ["parallel.tp=2", "parallel.dp=1", "parallel.sequence_parallel=true",
                        "train.precision=bf16"]),
    "tp2-sp-full-fp16": (2, ["parallel.tp=2", "parallel.dp=1", "parallel.sequence_parallel=true",
                             "train.recompute=\"full\"", "train.precision=fp16"]),
    "cp2-ring-bf16": (2, ["parallel.cp=2", "parallel.dp=1", "train.precision=bf16"]),
    "tp2-sp-full": (2, ["parallel.tp=2", "parallel.dp=1", "parallel.sequence_parallel=true",
                        "train.recompute=\"full\""]),
    "tp2-full": (2, ["parallel.tp=2", "parallel.dp=1", "train.recompute=\"full\""]),
    "tp2-selective": (2, ["parallel.tp=2", "parallel.dp=1", "train.recompute=\"selective\""]),
    # Selective recompute of the norms and the activation: their outputs in the model's scratch,
    # not saved per layer and micro-batch.
    "tp2-sp-norm-act-bf16": (2, ["parallel.tp=2", "parallel.dp=1",
                                 "parallel.sequence_parallel=true", "train.precision=bf16",
                                 "train.recompute=\"selective\"",
                                 "train.recompute_modules=[\"layernorm\", \"act\"]"]),
    # Full recompute's saved inputs split over tp (train.distribute_saved_activations): 1/tp of
    # each layer's input and of each stage's sent output, the gathers before each replay and
    # after each receive; under ZB-H1 the weight half replays (and gathers) again.
    "tp2-full-dist-bf16": (2, ["parallel.tp=2", "parallel.dp=1", "train.recompute=\"full\"",
                               "train.distribute_saved_activations=true", "train.precision=bf16"]),
    # (1F1B: under the interleaved schedule at 4 ranks on 2 cores, how many pipeline gradient
    # buffers are still sending at the peak depends on timing; recompute.py runs it bitwise.)
    "pp2-tp2-full-dist-bf16": (4, ["parallel.pp=2", "parallel.tp=2", "parallel.dp=1",
                                   "model.n_layers=4", "train.recompute=\"full\"",
                                   "train.distribute_saved_activations=true",
                                   "train.precision=bf16"]),
    "pp2-zb-h1-tp2-full-dist": (4, ["parallel.pp=2", "parallel.tp=2", "parallel.dp=1",
                                    "model.n_layers=4", "parallel.pp_schedule=\"zb-h1\"",
                                    "train.recompute=\"full\"", "train.recompute_layers=1",
                                    "train.distribute_saved_activations=true"]),
    "pp2": (2, ["parallel.pp=2", "parallel.dp=1"]),
    "pp2-interleaved": (2, ["parallel.pp=2", "parallel.dp=1", "model.n_layers=4",
                            "parallel.pp_schedule=\"interleaved\"", "parallel.virtual_stages=2"]),
    "cp2-ring": (2, ["parallel.cp=2", "parallel.dp=1"]),
    "cp2-ulysses-dp2-zero1": (4, ["parallel.cp=2", "parallel.cp_impl=\"ulysses\"",
                                  "parallel.dp=2", "parallel.zero_stage=1"]),
    "tp2-dp2-zero3": (4, ["parallel.tp=2", "parallel.dp=2", "parallel.zero_stage=3"]),
    "pp2-dp2-zero1-bf16": (4, ["parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=1",
                               "train.precision=bf16"]),
    "pp2-dp2-zero2": (4, ["parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=2"]),
    "pp2-dp2-zero3": (4, ["parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=3"]),
    # ZeRO under the other schedules: which units stay gathered between micro-batches.
    "pp2-interleaved-dp2-zero3": (4, ["parallel.pp=2", "parallel.dp=2", "model.n_layers=4",
                                      "parallel.pp_schedule=\"interleaved\"",
                                      "parallel.virtual_stages=2", "parallel.zero_stage=3"]),
    # (ZB-H1 refuses ZeRO-3; its stage-2 staging follows the weight halves' hooks.)
    "pp2-zb-h1-dp2-zero2": (4, ["parallel.pp=2", "parallel.dp=2", "parallel.pp_schedule=\"zb-h1\"",
                                "parallel.zero_stage=2"]),
    # ZB-V: rank 0 holds the embeddings and the head (one wte), the turn on rank 1 is a local
    # hand-off; its stashes and ZeRO-2's staging follow the weight halves.
    "pp2-zb-v": (2, ["parallel.pp=2", "parallel.dp=1", "model.n_layers=4",
                     "parallel.pp_schedule=\"zb-v\"", "parallel.virtual_stages=2"]),
    "pp2-zb-v-dp2-zero2-bf16": (4, ["parallel.pp=2", "parallel.dp=2", "model.n_layers=4",
                                    "parallel.pp_schedule=\"zb-v\"", "parallel.virtual_stages=2",
                                    "parallel.zero_stage=2", "train.precision=bf16"]),
    "pp2-zb-v-full": (2, ["parallel.pp=2", "parallel.dp=1", "model.n_layers=4",
                          "parallel.pp_schedule=\"zb-v\"", "parallel.virtual_stages=2",
                          "train.recompute=\"full\""]),
    # (Uneven, stage 2 empty: rank 0 holds layers 0, 2 and 3, so that its all-to-all averages
    # the routing over three layers.)
    "ep2-pp2-zb-v": (4, ["parallel.pp=2", "parallel.dp=2", "parallel.ep=2", "model.n_layers=4",
                         "parallel.pp_schedule=\"zb-v\"", "parallel.virtual_stages=2",
                         "parallel.pp_layers=[1, 1, 0, 2]"]),
    # DualPipeV: the V of ZB-V; only some backwards split (their stashes to the weight half), the
    # others whole; at least 2*pp-1 micro-batches.
    "pp2-dualpipev": (2, ["parallel.pp=2", "parallel.dp=1", "model.n_layers=4",
                          "parallel.pp_schedule=\"dualpipev\"", "parallel.virtual_stages=2"]),
    "ep2-pp2-dualpipev": (4, ["parallel.pp=2", "parallel.dp=2", "parallel.ep=2", "model.n_layers=4",
                              "parallel.pp_schedule=\"dualpipev\"", "parallel.virtual_stages=2",
                              "parallel.pp_layers=[1, 1, 0, 2]", "train.micro_batch_size=1"]),
    # Recompute on one rank (the MoE config runs these; tp layouts are the dense configs').
    "full": (1, ["train.recompute=\"full\""]),
    "selective": (1, ["train.recompute=\"selective\""]),
    "norm-act": (1, ["train.recompute=\"selective\"",
                     "train.recompute_modules=[\"core_attn\", \"layernorm\", \"act\"]"]),
    # The routed experts' activation recomputed (MoE config): not saved (the model's scratch holds
    # one layer's), and under ep not kept with the received rows (a buffer of its own for the
    # moment fc2's forward or weight gradient reads it), in the V's chunks of a split stage.
    "moe-act": (1, ["train.recompute=\"selective\"", "train.recompute_modules=[\"moe_act\"]"]),
    "ep2-pp2-zb-v-moe-act-bf16": (4, ["parallel.pp=2", "parallel.dp=2", "parallel.ep=2",
                                      "model.n_layers=4", "parallel.pp_schedule=\"zb-v\"",
                                      "parallel.virtual_stages=2", "parallel.pp_layers=[1, 1, 0, 2]",
                                      "train.precision=\"bf16\"",
                                      "train.recompute=\"selective\"",
                                      "train.recompute_modules=[\"layernorm\", \"moe_act\"]"]),
    # Latent attention's up projections recomputed (MLA config): the core's input rebuilt from the
    # latents into one buffer of the model's scratch, under tp + sp with the core recomputed too.
    "tp2-sp-up-proj-bf16": (2, ["parallel.tp=2", "parallel.dp=1", "parallel.sequence_parallel=true",
                                "train.precision=\"bf16\"", "train.recompute=\"selective\"",
                                "train.recompute_modules=[\"core_attn\", \"mla_up_proj\"]"]),
    "pp2-full-first": (2, ["parallel.pp=2", "parallel.dp=1", "train.recompute=\"full\"",
                           "train.recompute_layers=1"]),
    # Capacity under cp (MoE config): the chunks' counts that rank the assignments.
    "capacity-cp2": (2, ["parallel.cp=2", "parallel.dp=1", "model.moe.capacity_factor=1.0"]),
    "capacity-cp2-tp2-sp": (4, ["parallel.cp=2", "parallel.tp=2", "parallel.dp=1",
                                "parallel.sequence_parallel=true", "model.moe.capacity_factor=1.0"]),
    "tp2-sp-dp2": (4, ["parallel.tp=2", "parallel.dp=2", "parallel.sequence_parallel=true"]),
    "ep2-tp2-sp": (4, ["parallel.tp=2", "parallel.dp=2", "parallel.sequence_parallel=true",
                       "parallel.ep=2"]),
    # ZeRO under tp (MoE config): the routed parameters over tp x dp (x cp), or under ep over
    # the expert-data group x tp; tp2-sp-zero1's is the tp pair alone.
    "tp2-sp-zero1": (2, ["parallel.tp=2", "parallel.dp=1", "parallel.sequence_parallel=true",
                         "parallel.zero_stage=1"]),
    "tp2-sp-dp2-zero2": (4, ["parallel.tp=2", "parallel.dp=2", "parallel.sequence_parallel=true",
                             "parallel.zero_stage=2"]),
    "tp2-sp-dp2-zero3": (4, ["parallel.tp=2", "parallel.dp=2", "parallel.sequence_parallel=true",
                             "parallel.zero_stage=3"]),
    "ep2-tp2-sp-zero3": (4, ["parallel.tp=2", "parallel.dp=2", "parallel.sequence_parallel=true",
                             "parallel.ep=2", "parallel.zero_stage=3"]),
    "cp2-tp2-sp-zero1": (4, ["parallel.cp=2", "parallel.tp=2", "parallel.dp=1",
                             "parallel.sequence_parallel=true", "parallel.zero_stage=1"]),
    # Expert parallelism (MoE config): DDP, and ZeRO with the expert stacks over the edp group.
    "ep2-dp4": (4, ["parallel.dp=4", "parallel.ep=2"]),
    "ep2-zero1-dp4": (4, ["parallel.dp=4", "parallel.ep=2", "parallel.zero_stage=1"]),
    "ep2-zero3-dp4": (4, ["parallel.dp=4", "parallel.ep=2", "parallel.zero_stage=3"]),
    # ep with full recompute (Mixtral's shipped combination): the experts' rows of every MoE layer
    # stay from the forward to the backward, the replay returns them instead of recomputing.
    "ep2-full": (4, ["parallel.dp=4", "parallel.ep=2", "train.recompute=\"full\""]),
    "ep2-tp2-sp-full": (4, ["parallel.tp=2", "parallel.dp=2", "parallel.sequence_parallel=true",
                            "parallel.ep=2", "train.recompute=\"full\""]),
    # FP8 GEMM inputs: the quantised copies in the model's scratch (the experts' too), and under
    # ep for the received rows (counted at the input backward's moment); tensorwise under tp
    # all-reduces one amax per split tensor (4 bytes each: within the comm tolerance).
    "bf16-fp8": (1, ["train.precision=\"bf16\"", "train.fp8=\"blockwise\"",
                     "train.fp8_block=16"]),
    "tp2-fp8-tensorwise": (2, ["parallel.tp=2", "parallel.dp=1", "train.precision=\"bf16\"",
                               "train.fp8=\"tensorwise\""]),
    "ep2-dp4-fp8": (4, ["parallel.dp=4", "parallel.ep=2", "train.precision=\"bf16\"",
                        "train.fp8=\"blockwise\"", "train.fp8_block=16"]),
    # Hybrid sharding: the state sharded over groups of 2 dp ranks, the collectives inside them
    # (the groups "dp_shard" etc.), the shards' gradients all-reduced across ("dp_replica").
    "hsdp2-zero3-dp4": (4, ["parallel.dp=4", "parallel.zero_stage=3",
                            "parallel.zero_shard_group=2"]),
    "hsdp2-zero1-dp4-bf16": (4, ["parallel.dp=4", "parallel.zero_stage=1",
                                 "parallel.zero_shard_group=2", "train.precision=bf16"]),
    "ep2-hsdp2-zero2-dp4": (4, ["parallel.dp=4", "parallel.ep=2", "parallel.zero_stage=2",
                                "parallel.zero_shard_group=2"]),
    # ZeRO++'s quantised weights: stage 3 gathers int8 blocks (and their scales), dequantised
    # into the compute type; under ep the expert stacks' part over the edp group too.
    "zero3-dp4-qw": (4, ["parallel.dp=4", "parallel.zero_stage=3",
                         "parallel.zero_quantized_weights=true", "parallel.zero_quant_block=64"]),
    "zero3-dp2-accum2-qw-bf16": (2, ["parallel.dp=2", "parallel.zero_stage=3",
                                     "parallel.zero_quantized_weights=true",
                                     "train.global_batch_size=8", "train.precision=bf16"]),
    "ep2-zero3-dp4-qw": (4, ["parallel.dp=4", "parallel.ep=2", "parallel.zero_stage=3",
                             "parallel.zero_quantized_weights=true"]),
    # ZeRO++'s hpZ: the secondary copy (params), the first gather of each unit over dp, the
    # others within pairs of dp ranks ("dp_shard"); with 4 micro-batches per rank, and with qwZ.
    "hpz2-zero3-dp4-accum": (4, ["parallel.dp=4", "parallel.zero_stage=3",
                                 "parallel.zero_hierarchical_partition=2",
                                 "train.global_batch_size=16"]),
    "hpz2-zero3-dp4-qw-bf16": (4, ["parallel.dp=4", "parallel.zero_stage=3",
                                   "parallel.zero_hierarchical_partition=2",
                                   "parallel.zero_quantized_weights=true", "train.precision=bf16"]),
    "ep2-hpz2-zero3-dp4": (4, ["parallel.dp=4", "parallel.ep=2", "parallel.zero_stage=3",
                               "parallel.zero_hierarchical_partition=2"]),
    "pp2-hpz1-zero3-dp2": (4, ["parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=3",
                               "parallel.zero_hierarchical_partition=1"]),
    # ZeRO++'s qgZ: the gradients' int4 all-to-alls (packed gradients, blocks sent and received,
    # dequantised sums) instead of the reduce-scatters; one hop over dp, two with hpZ's pairs
    # (within "dp_shard", across "dp_replica"), inside hybrid sharding's shard groups ("dp_cross").
    "zero3-dp4-qg": (4, ["parallel.dp=4", "parallel.zero_stage=3",
                         "parallel.zero_quantized_gradients=true", "parallel.zero_quant_block=64"]),
    "zero3-dp4-qg-hop2": (4, ["parallel.dp=4", "parallel.zero_stage=3",
                              "parallel.zero_quantized_gradients=true",
                              "parallel.zero_quantized_gradients_group=2"]),
    "hpz2-zero3-dp4-accum-qg-bf16": (4, ["parallel.dp=4", "parallel.zero_stage=3",
                                         "parallel.zero_hierarchical_partition=2",
                                         "parallel.zero_quantized_gradients=true",
                                         "train.global_batch_size=16", "train.precision=bf16"]),
    "hsdp2-hpz1-zero3-dp4-qg-gradc": (4, ["parallel.dp=4", "parallel.zero_stage=3",
                                          "parallel.zero_shard_group=2",
                                          "parallel.zero_hierarchical_partition=1",
                                          "parallel.zero_quantized_gradients=true",
                                          "train.precision=bf16", "train.grad_dtype=compute"]),
    # [offload] "nvme": the offloaded state leaves params and optimizer (in files instead).
    "zero3-dp2-offload": (2, ["parallel.dp=2", "parallel.zero_stage=3", "offload.optimizer=nvme",
                              "offload.params=nvme", "offload.nvme_dir=/tmp"]),
    "zero1-dp2-offload-bf16": (2, ["parallel.dp=2", "parallel.zero_stage=1",
                                   "train.precision=bf16", "offload.optimizer=nvme",
                                   "offload.nvme_dir=/tmp"]),
    "ep2-hpz2-zero3-dp4-qg": (4, ["parallel.dp=4", "parallel.ep=2", "parallel.zero_stage=3",
                                  "parallel.zero_hierarchical_partition=2",
                                  "parallel.zero_quantized_gradients=true"]),
}
# --layouts moe: what a mixture-of-experts config can run.
MOE_LAYOUTS = ["single", "bf16", "dp2", "zero1-dp2", "zero2-dp2-accum2", "zero3-dp3", "pp2",
               "pp2-interleaved", "pp2-dp2-zero1-bf16", "full", "selective", "pp2-full-first",
               "cp2-ring", "cp2-ulysses-dp2-zero1", "capacity-cp2", "ep2-dp4", "ep2-zero1-dp4",
               "ep2-zero3-dp4", "tp2-sp", "tp2-sp-dp2", "tp2-sp-full", "ep2-tp2-sp",
               "capacity-cp2-tp2-sp", "tp2-sp-zero1", "tp2-sp-dp2-zero2", "tp2-sp-dp2-zero3",
               "ep2-tp2-sp-zero3", "cp2-tp2-sp-zero1", "pp2-zb-h1-dp2-zero2", "ep2-full",
               "ep2-tp2-sp-full", "tp2-sp-bf16", "tp2-sp-full-fp16", "zero2-dp2-accum2-fp16",
               "dp2-bf16-gradc", "zero2-dp2-accum2-fp16-gradc", "tp2-sp-dp2-bf16-gradc",
               "ep2-dp4-bf16-gradc", "bf16-fp8", "ep2-dp4-fp8", "hsdp2-zero3-dp4",
               "ep2-hsdp2-zero2-dp4", "zero3-dp4-qw", "ep2-zero3-dp4-qw", "ep2-hpz2-zero3-dp4",
               "ep2-hpz2-zero3-dp4-qg", "pp2-zb-v", "ep2-pp2-zb-v", "ep2-pp2-dualpipev", "norm-act",
               "moe-act", "ep2-pp2-zb-v-moe-act-bf16"]
# --layouts mla: latent attention (configs/mla-tiny.toml) under tp + sp (its latents gathered),
# pp, cp, ZeRO, recompute and 16 bits.
MLA_LAYOUTS = ["single", "bf16", "zero3-dp3", "tp2-sp", "tp2-sp-bf16", "tp2-sp-full",
               "tp2-sp-dp2-zero3", "pp2", "pp2-zb-h1-dp2-zero2", "cp2-ring", "cp2-ulysses-dp2-zero1",
               "cp2-tp2-sp-zero1", "full", "selective", "tp2-sp-norm-act-bf16",
               "tp2-sp-up-proj-bf16"]
# --layouts mtp: multi-token prediction (configs/mtp-tiny.toml: two modules with the head) under
# tp + sp, cp, ZeRO, recompute and 16 bits, and under pp (rank 0 the first stage: the last
# stage's copy of wte summed with it).
MTP_LAYOUTS = ["single", "bf16", "zero3-dp3", "tp2-sp", "tp2-sp-bf16", "tp2-sp-full",
               "tp2-sp-dp2-zero3", "cp2-ring", "cp2-ulysses-dp2-zero1", "cp2-tp2-sp-zero1", "full",
               "selective", "pp2-dp2-zero3", "pp2-zb-v", "norm-act"]
# --layouts muon / muon-moe (with --set optimizer.type=muon): Muon's momentum and buffers, its
# row all-gathers under ZeRO and its tp all-gathers (Shard(0) and Shard(1) matrices).
MUON_LAYOUTS = ["single", "bf16", "dp2", "zero1-dp2", "zero3-dp3", "tp2-sp", "tp2-dp2-zero3",
                "pp2-dp2-zero2"]
MUON_MOE_LAYOUTS = ["zero3-dp3", "ep2-zero3-dp4", "tp2-sp-dp2-zero3", "ep2-tp2-sp-zero3"]
DENSE_LAYOUTS = [n for n in LAYOUTS
                 if n not in ("full", "selective", "norm-act", "moe-act", "pp2-full-first",
                              "tp2-sp-up-proj-bf16")
                 and not n.startswith(("ep", "capacity"))]
PEAK_BOUND = 0.01
KINDS = ["all_reduce", "reduce_scatter", "all_gather", "send", "recv", "all_to_all"]


def counted(comm, axis):
    """Rank 0's counters of one plan axis: the axis's own group, plus the dp x cp group, the
    expert groups (ep, edp, edp x tp) and MoE's tp x dp group under dp (and under hybrid
    sharding the shard and replica groups split from each), and the tied-embedding group under
    pp."""
    total = {k: 0 for k in KINDS}
    for name, kinds in comm.items():
        # hybrid sharding, hpZ and qgZ: NAME_shard, NAME_replica (with their size when a second
        # cut of the group exists) and NAME_cross count as NAME
        group = re.sub(r"_(shard|replica|cross)\d*$", "", name)
        axes = set(group.split("x"))
        mine = (group == axis or (axis == "dp" and axes == {"dp", "cp"}) or
                (axis == "dp" and group in ("ep", "edp", "edpxtp")) or
                # MoE under tp: the routed gradients' tp x dp (x cp) group
                (axis == "dp" and len(axes) > 1 and "tp" in axes and axes & {"dp", "cp"}) or
                (axis == "pp" and group == "embedding"))
        if mine:
            for k, v in kinds.items():
                total[k] = total.get(k, 0) + v
    return total


def boundary_bytes(config, sets):
    """One pipeline boundary tensor of a micro-batch of 1: (seq_len / cp, d_model) f32."""
    with open(config, "rb") as f:
        model = tomllib.load(f)["model"]
    cp = int(next((s.split("=")[1] for s in sets if s.startswith("parallel.cp=")), 1))
    return 4 * model["seq_len"] // cp * model["d_model"]


def main():
    def options(ap):
        ap.add_argument(
            "--layouts", choices=["dense", "moe", "mla", "mtp", "muon", "muon-moe"],
            default="dense", help="the dense configs' layout matrix, the mixture-of-experts one, "
            "latent attention's, or Muon's")
        ap.add_argument("--only", help="comma-separated layouts of that matrix to run alone")
    args = harness.parse_args(options)
    failures = []
    names = {"dense": DENSE_LAYOUTS, "moe": MOE_LAYOUTS, "mla": MLA_LAYOUTS, "mtp": MTP_LAYOUTS,
             "muon": MUON_LAYOUTS,
             "muon-moe": MUON_MOE_LAYOUTS}[args.layouts]
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    for name in names:
        ranks, sets = LAYOUTS[name]
        sets = sets + ["train.steps=2", "train.micro_batch_size=1"] + args.sets
        cmd = [args.llmtrain, "plan", "--config", args.config, "--world", str(ranks)]
        for s in sets:
            cmd += ["--set", s]
        out = harness.run(cmd)
        m = re.search(r"rank 0 \(tp 0, pp 0\): params (\d+), grads (\d+), optimizer (\d+)", out)
        if not m:
            failures.append(f"{name}: no rank 0 line in plan:\n{out}")
            continue
        planned = dict(zip(["params", "grads", "optimizer"], map(int, m.groups())))
        cost = json.loads(harness.run(cmd + ["--json"]))
        last = harness.train(args, f"{args.workdir}/{name}", ranks, sets)[-1]
        peak = last["peak_bytes"]
        for k, v in planned.items():
            if abs(v - peak[k]) > 0.02 * peak[k]:
                failures.append(f"{name}: {k} planned {v} B, allocated {peak[k]} B")
        print(f"{name}: state planned {planned}, allocated "
              f"{ {k: peak[k] for k in planned} }")
        stage = cost["stages"][0]
        pipelined = any(s.startswith("parallel.pp=") and s != "parallel.pp=1" for s in sets)
        # Under ep a fully recomputed MoE layer's received rows live from its backward's start
        # (MoeMlp dispatches them again there): the peak holds one layer's, as many as the
        # routing sent it, where plan assumes balanced routing (as for the all-to-all).
        ep_full = any(s.startswith("parallel.ep=") and s != "parallel.ep=1" for s in sets) and \
            any(s.startswith("train.recompute=") and "full" in s for s in sets)
        for k, bound in (("activations", 0.05 if ep_full else 0.02), ("comm", 0.02)):
            est, got = stage["memory"][k], peak[k]
            ratio = est / got if got else (1.0 if est == 0 else float("inf"))
            print(f"{name}: {k} estimated {est:.0f} B, allocated {got} B (x{ratio:.3f})")
            # Under pp plan's comm adds the executor's bound to ZeRO's peak: a sent gradient's
            # buffer may be freed before the next one is allocated, and in a V (rank 0 receives
            # one gradient and sends two) none of the three need be live when ZeRO's peak.
            held = 3 if any("zb-v" in s or "dualpipev" in s for s in sets) else 1
            if (k == "comm" and pipelined
                    and est - held * boundary_bytes(args.config, sets) <= got <= est):
                continue
            if bound is not None and abs(ratio - 1) > bound:
                failures.append(f"{name}: {k} estimated {est:.0f} B, allocated {got} B")
        # The concurrent peak: a replay of the step's allocations (activations and ZeRO's
        # buffers together) against the allocator's peak of all categories at once.
        mem = stage["memory"]
        summed = sum(mem[k] for k in ("params", "grads", "optimizer", "activations", "comm"))
        ratio = mem["peak"] / peak["total"]
        print(f"{name}: concurrent peak planned {mem['peak']:.0f} B, allocated {peak['total']} B "
              f"(x{ratio:.3f}; the categories' peaks summed x{summed / peak['total']:.3f})")
        if abs(ratio - 1) > PEAK_BOUND:
            failures.append(f"{name}: concurrent peak planned {mem['peak']:.0f} B, allocated "
                            f"{peak['total']} B")
        comm = last.get("comm_bytes", {})
        planned_bytes = stage["bytes"]
        merged = "dp" not in comm and "cp" in comm
        if merged:
            # dp = 1: the dp x cp group is the cp axis's own communicator; plan's dp bytes are
            # compared with the cp axis's and the other groups plan counts with dp, together.
            planned_bytes["cp"] = {k: planned_bytes["cp"].get(k, 0) + planned_bytes["dp"].get(k, 0)
                                   for k in KINDS}
            planned_bytes["dp"] = {}
        for axis in ("tp", "cp", "dp", "pp"):
            want = planned_bytes[axis]
            got = counted(comm, axis)
            if merged and axis in ("cp", "dp"):
                got = ({k: got.get(k, 0) + counted(comm, "dp").get(k, 0) for k in KINDS}
                       if axis == "cp" else {})
            for k in KINDS:
                w, g = want.get(k, 0), got.get(k, 0)
                if w == 0 and g == 0:
                    continue
                # Under ep the all-to-all depends on the routing; plan assumes it balanced.
                routed = k == "all_to_all" and any(s.startswith("parallel.ep=") for s in sets)
                ok = abs(g - w) <= max(64, (0.05 if routed else 0.005) * w)
                print(f"{name}: {axis} {k} planned {w:.0f}, counted {g}"
                      f"{'' if ok else '  <-- MISMATCH'}")
                if not ok:
                    failures.append(f"{name}: {axis} {k} planned {w:.0f} B, counted {g} B")
    harness.finish(failures)


if __name__ == "__main__":
    main()
