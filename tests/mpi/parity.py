#!/usr/bin/python3
"""Layout parity: run config C on one rank (cached per workdir) and at layout L under mpirun for
its train.steps, then compare per-step loss and grad_norm (relative 1e-5 at step 1, 1e-4 after)
and the parameters after the last step (--dump-final, gathered at global shape on rank 0).

Layouts: dpN (DDP over N ranks), zeroS-dpN (ZeRO stage S; dp3 with global batch 6, so that
shards are uneven and padded), accum4-dp2 (micro-batch 1: four accumulation steps per rank on
2 ranks), tpN (tensor parallel, dp 1), tp2-sp (with sequence parallelism), tp2-dp2-zeroS[-sp]
(tp inside dp with ZeRO), ppN-<schedule> (pipeline parallel), pp2-tp2-dp2-zero1, pp2-dp2,
cpN-ring / cpN-ulysses (context parallel) and cp composed with tp+sp, ZeRO-3, pp, dropout and
selective recompute, hsdpN-... (hybrid sharding: ZeRO within groups of N dp ranks), qw16-...
(ZeRO-3 with int8 weight all-gathers in blocks of 16, against one rank quantising alike),
hpzN-... (ZeRO-3 with a secondary copy of the weights within groups of N dp ranks), qg1-...
(ZeRO-3 with int4 gradient all-to-alls in blocks of 1, against the plain single rank); for latent
attention q-... (a full-rank query), moe-... (with experts) and yarn-... (YaRN with DeepSeek's
factor on the scores); rope-... (RoPE scaling, Llama 3.1's or YaRN's); for multi-token prediction
moe-bias-... (experts balanced by the bias) and tied-... (tied embeddings). Prints one line: layout, max
relative differences."""
import os

import numpy as np

from harness import finish, parse_args, train

# layout: (ranks, its --set overrides, overrides for both it and its single-rank reference)
GBS6 = ["train.global_batch_size=6"]  # 3 ranks: uneven shards (vocab 256, d_model 64 over 3)
L4 = ["model.n_layers=4"]
BIAS = ["model.moe.balance=bias", "model.moe.bias_update_rate=0.01"]
# DeepSeek-V3's router: sigmoid scores, bias balancing, group-limited (1 of 2 groups), scaled.
GROUP = BIAS + ["model.moe.router=sigmoid", "model.moe.n_group=2", "model.moe.topk_group=1",
                "model.moe.routed_scaling_factor=2.5"]
# qgZ with blocks of one value: each value its own scale (|v| / 7, code +-7), read back within an
# ulp, so the quantised all-to-alls sum what the reduce-scatter sums and any misrouted block
# shows (against the plain single-rank run).
QG1 = ["parallel.zero_stage=3", "parallel.zero_quantized_gradients=true",
       "parallel.zero_quant_block=1"]
QW16 = ["parallel.zero_stage=3", "parallel.zero_quantized_weights=true",
        "parallel.zero_quant_block=16", "optimizer.lr=1e-30", "optimizer.min_lr=0"]
# Latent attention (configs/mla-tiny.toml) with a full-rank query, and in an MoE model with ep.
MLA_Q = ["model.mla.q_lora_rank=0"]
MLA_MOE = ["model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.d_ff_expert=64"]
# RoPE scaling over an original context of 8 (the tiny configs' seq_len is 32).
ROPE_LLAMA3 = ["model.rope_scaling.rope_type=llama3", "model.rope_scaling.factor=4.0",
               "model.rope_scaling.original_max_position_embeddings=8"]
ROPE_YARN = ["model.rope_scaling.rope_type=yarn", "model.rope_scaling.factor=4.0",
             "model.rope_scaling.original_max_position_embeddings=8"]
LAYOUTS = {
    "dp2": (2, [], []),
    "q-tp2-sp": (2, ["parallel.tp=2", "parallel.sequence_parallel=true"], MLA_Q),
    "q-cp2-ulysses-zero3": (2, ["parallel.cp=2", "parallel.cp_impl=ulysses",
                                "parallel.zero_stage=3"], MLA_Q),
    "moe-ep2-tp2-sp-zb-h1": (8, ["parallel.ep=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                                 "parallel.pp=2", "parallel.pp_schedule=zb-h1"], MLA_MOE),
    # Multi-token prediction (configs/mtp-tiny.toml) with experts in every layer, its modules'
    # included, balanced by the bias at ep2 x pp2; and with tied embeddings (the last stage's copy
    # of wte serves the head and the modules' embedding).
    "moe-bias-ep2-pp2": (4, ["parallel.ep=2", "parallel.pp=2"], MLA_MOE + BIAS),
    "tied-pp2-dp2-zero1": (4, ["parallel.pp=2", "parallel.zero_stage=1"],
                           ["model.tie_embeddings=true"]),
    # (In a V the modules sit with the head on rank 0, beside the embedding they share.)
    "moe-bias-ep2-pp2-zb-v": (4, ["parallel.ep=2", "parallel.pp=2", "parallel.pp_schedule=zb-v",
                                  "parallel.virtual_stages=2"], MLA_MOE + BIAS + L4),
    "dp4": (4, [], []),
    "zero1-dp2": (2, ["parallel.zero_stage=1"], []),
    "zero2-dp2": (2, ["parallel.zero_stage=2"], []),
    "zero3-dp4": (4, ["parallel.zero_stage=3"], []),
    "accum4-dp2": (2, ["train.micro_batch_size=1"], []),
    "zero1-dp3": (3, ["parallel.zero_stage=1"], GBS6),
    "zero3-dp3": (3, ["parallel.zero_stage=3"], GBS6),
    "tp2": (2, ["parallel.tp=2"], []),
    # kv heads must divide by tp (the Llama config has 2): 4 kv heads for 4 heads.
    "tp4": (4, ["parallel.tp=4"], ["model.n_kv_heads=4"]),
    "tp2-sp": (2, ["parallel.tp=2", "parallel.sequence_parallel=true"], []),
    "tp2-dp2-zero1": (4, ["parallel.tp=2", "parallel.zero_stage=1"], []),
    "tp2-dp2-zero3-sp": (4, ["parallel.tp=2", "parallel.zero_stage=3",
                             "parallel.sequence_parallel=true"], []),
    # Pipeline parallel (4 micro-batches per step): the 4-stage layouts need 4 layers, also in
    # their single-rank reference; interleaved runs 2 chunks of one layer per rank.
    "pp2-1f1b": (2, ["parallel.pp=2", "parallel.pp_schedule=1f1b"], []),
    "pp4-gpipe": (4, ["parallel.pp=4", "parallel.pp_schedule=gpipe"], L4),
    "pp4-1f1b": (4, ["parallel.pp=4", "parallel.pp_schedule=1f1b"], L4),
    "pp2-interleaved": (2, ["parallel.pp=2", "parallel.pp_schedule=interleaved",
                            "parallel.virtual_stages=2"], L4),
    # Uneven stages: 1 layer on stage 0, 3 on stage 1.
    "pp2-uneven": (2, ["parallel.pp=2", "parallel.pp_layers=[1, 3]"], L4),
    "pp2-tp2-dp2-zero1": (8, ["parallel.pp=2", "parallel.tp=2", "parallel.zero_stage=1"], []),
    "pp4-zb-h1": (4, ["parallel.pp=4", "parallel.pp_schedule=zb-h1"], L4),
    "pp2-zb-h1-dp2-zero2": (4, ["parallel.pp=2", "parallel.pp_schedule=zb-h1",
                                "parallel.zero_stage=2"], []),
    # ZB-V: two chunks per rank in a V (rank 0 holds the embeddings and the head, the turn on the
    # last rank is a local hand-off), with uneven and empty stages at pp4, tied embeddings, ZeRO-2
    # and cp.
    "pp2-zb-v": (2, ["parallel.pp=2", "parallel.pp_schedule=zb-v", "parallel.virtual_stages=2"],
                 L4),
    "pp4-zb-v-uneven": (4, ["parallel.pp=4", "parallel.pp_schedule=zb-v",
                            "parallel.virtual_stages=2",
                            "parallel.pp_layers=[1, 0, 1, 1, 1, 1, 0, 1]"], ["model.n_layers=6"]),
    "tied-pp2-zb-v": (2, ["parallel.pp=2", "parallel.pp_schedule=zb-v",
                          "parallel.virtual_stages=2"], L4 + ["model.tie_embeddings=true"]),
    "pp2-zb-v-dp2-zero2": (4, ["parallel.pp=2", "parallel.pp_schedule=zb-v",
                               "parallel.virtual_stages=2", "parallel.zero_stage=2"], L4),
    "pp2-zb-v-tp2-sp": (4, ["parallel.pp=2", "parallel.pp_schedule=zb-v", "parallel.virtual_stages=2",
                            "parallel.tp=2", "parallel.sequence_parallel=true"], L4),
    "cp2-pp2-zb-v": (4, ["parallel.cp=2", "parallel.pp=2", "parallel.pp_schedule=zb-v",
                         "parallel.virtual_stages=2"], L4),
    # DualPipeV: ZB-V's stages, the steady phase's forward and full backward in pairs, some
    # backwards split (at least 2*pp-1 micro-batches: 4 at pp2, 8 at pp4).
    "pp2-dualpipev": (2, ["parallel.pp=2", "parallel.pp_schedule=dualpipev",
                          "parallel.virtual_stages=2"], L4),
    "pp4-dualpipev-uneven": (4, ["parallel.pp=4", "parallel.pp_schedule=dualpipev",
                                 "parallel.virtual_stages=2",
                                 "parallel.pp_layers=[1, 0, 1, 1, 1, 1, 0, 1]"],
                             ["model.n_layers=6", "train.micro_batch_size=1"]),
    # At most one weight half deferred a rank (parallel.pp_max_deferred): the drain's backwards
    # run whole once one waits.
    "pp4-dualpipev-deferred1": (4, ["parallel.pp=4", "parallel.pp_schedule=dualpipev",
                                    "parallel.virtual_stages=2", "parallel.pp_max_deferred=1"],
                                ["model.n_layers=8", "train.micro_batch_size=1"]),
    # Deferring nothing, DualPipeV splits no backward: ZeRO-3 gathers around whole backwards.
    "pp2-dualpipev-dp2-zero3-whole": (4, ["parallel.pp=2", "parallel.pp_schedule=dualpipev",
                                          "parallel.virtual_stages=2", "parallel.zero_stage=3",
                                          "parallel.pp_max_deferred=0"],
                                      L4 + ["train.micro_batch_size=1"]),
    "pp4-zb-h1-deferred1": (4, ["parallel.pp=4", "parallel.pp_schedule=zb-h1",
                                "parallel.pp_max_deferred=1"], L4),
    "pp2-dualpipev-dp2-zero1": (4, ["parallel.pp=2", "parallel.pp_schedule=dualpipev",
                                    "parallel.virtual_stages=2", "parallel.zero_stage=1"],
                                L4 + ["train.micro_batch_size=1"]),
    "pp2-dp2": (4, ["parallel.pp=2"], []),
    "pp2-tp2-sp-zero3": (8, ["parallel.pp=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                             "parallel.zero_stage=3"], []),
    "pp2-interleaved-dp2": (4, ["parallel.pp=2", "parallel.pp_schedule=interleaved",
                                "parallel.virtual_stages=2"], L4),
    # Validation through the pipeline (val_loss compared as well).
    "pp2-interleaved-eval": (2, ["parallel.pp=2", "parallel.pp_schedule=interleaved",
                                 "parallel.virtual_stages=2"],
                             L4 + ["train.eval_interval=5", "train.eval_iters=2"]),
    "pp2-dp2-zero2": (4, ["parallel.pp=2", "parallel.zero_stage=2"], []),
    "pp2-dp2-zero3": (4, ["parallel.pp=2", "parallel.zero_stage=3"], []),
    "pp2-interleaved-dp2-zero3": (4, ["parallel.pp=2", "parallel.pp_schedule=interleaved",
                                      "parallel.virtual_stages=2", "parallel.zero_stage=3"], L4),
    # Context parallel (seq_len 32: chunks of 8 at cp 2, of 4 at cp 4). Ulysses at cp 4 splits
    # each rank's heads over 4, so the Llama config's 2 kv heads become 4 (also in its reference).
    "cp2-ring": (2, ["parallel.cp=2", "parallel.cp_impl=ring"], []),
    "cp4-ring": (4, ["parallel.cp=4", "parallel.cp_impl=ring"], []),
    # Latent attention's ring moving the expanded K/V instead of the latent.
    "cp4-ring-kv": (4, ["parallel.cp=4", "parallel.cp_latent=false"], []),
    "cp2-ulysses": (2, ["parallel.cp=2", "parallel.cp_impl=ulysses"], []),
    "cp4-ulysses": (4, ["parallel.cp=4", "parallel.cp_impl=ulysses"], ["model.n_kv_heads=4"]),
    # Latent attention's Ulysses: the queries through the all-to-all, the latent all-gathered and
    # each rank's heads expanded (a row slice of kv_b); the expanded K/V through the all-to-all
    # when parallel.cp_latent = false.
    "cp4-ulysses-latent": (4, ["parallel.cp=4", "parallel.cp_impl=ulysses"], []),
    "cp2-ulysses-kv": (2, ["parallel.cp=2", "parallel.cp_impl=ulysses", "parallel.cp_latent=false"],
                       []),
    "cp2-ulysses-tp2-sp": (4, ["parallel.cp=2", "parallel.cp_impl=ulysses", "parallel.tp=2",
                               "parallel.sequence_parallel=true"], []),
    # Hybrid: all-to-all over pairs of cp ranks, ring over the two pairs.
    "cp4-hybrid": (4, ["parallel.cp=4", "parallel.cp_impl=hybrid", "parallel.cp_ulysses=2"], []),
    "cp2-tp2-sp": (4, ["parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"], []),
    "cp2-dp2-zero3": (4, ["parallel.cp=2", "parallel.zero_stage=3"], []),
    "cp2-pp2-1f1b": (4, ["parallel.cp=2", "parallel.pp=2", "parallel.pp_schedule=1f1b"], []),
    "cp2-ring-dropout": (2, ["parallel.cp=2"], ["model.dropout=0.1"]),
    "cp2-dp2": (4, ["parallel.cp=2"], []),
    "cp2-accum4": (2, ["parallel.cp=2", "train.micro_batch_size=1"], []),
    "cp2-pp2-interleaved": (4, ["parallel.cp=2", "parallel.pp=2", "parallel.pp_schedule=interleaved",
                                "parallel.virtual_stages=2"], L4),
    "cp2-pp2-zb-h1": (4, ["parallel.cp=2", "parallel.pp=2", "parallel.pp_schedule=zb-h1"], []),
    "cp2-ring-recompute": (2, ["parallel.cp=2", "train.recompute=selective"], []),
    # RoPE scaling ([model.rope_scaling], RoPE models): the scaled frequencies at context
    # parallelism's global positions and over tp; YaRN's factor on cos and sin, and (latent
    # attention, DeepSeek's mscale_all_dim) on the scores.
    "rope-llama3-cp2-ring": (2, ["parallel.cp=2", "parallel.cp_impl=ring"], ROPE_LLAMA3),
    "rope-yarn-cp2-ulysses": (2, ["parallel.cp=2", "parallel.cp_impl=ulysses"], ROPE_YARN),
    "rope-llama3-tp2-sp-pp2": (4, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                   "parallel.pp=2"], ROPE_LLAMA3),
    "yarn-cp2-tp2-sp": (4, ["parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"],
                        ROPE_YARN + ["model.rope_scaling.mscale_all_dim=1.0"]),
    # Mixture of experts (configs/moe-tiny.toml): capacity dropping at dp 2 and 4 (its rule reads
    # one sequence, so the layout does not change which tokens drop).
    "capacity-dp2": (2, [], ["model.moe.capacity_factor=1.0"]),
    "capacity-zero1-dp4": (4, ["parallel.zero_stage=1"], ["model.moe.capacity_factor=1.0"]),
    # Aux-loss-free balancing: every replica (DDP), row shard (ZeRO, 4 experts over 3 ranks) and
    # pipeline stage moves its biases by the step's global load.
    "bias-dp2": (2, [], BIAS),
    "bias-zero3-dp3": (3, ["parallel.zero_stage=3"], BIAS + GBS6),
    "bias-zero1-dp2": (2, ["parallel.zero_stage=1"], BIAS),
    "bias-pp2-dp2": (4, ["parallel.pp=2"], BIAS),
    # Expert parallelism: the experts split over ep consecutive dp ranks (all-to-all dispatch),
    # their gradients reduced over the dp ranks holding the same experts.
    "ep2": (2, ["parallel.ep=2"], []),
    "ep4": (4, ["parallel.ep=4"], []),
    "ep2-dp4": (4, ["parallel.ep=2"], []),
    "ep2-accum4": (2, ["parallel.ep=2", "train.micro_batch_size=1"], []),
    "ep2-pp2": (4, ["parallel.ep=2", "parallel.pp=2"], []),
    "ep2-pp2-zb-h1": (4, ["parallel.ep=2", "parallel.pp=2", "parallel.pp_schedule=zb-h1"], []),
    "ep2-pp2-zb-v": (4, ["parallel.ep=2", "parallel.pp=2", "parallel.pp_schedule=zb-v",
                         "parallel.virtual_stages=2"], []),
    "ep2-pp2-dualpipev": (4, ["parallel.ep=2", "parallel.pp=2", "parallel.pp_schedule=dualpipev",
                              "parallel.virtual_stages=2"], ["train.micro_batch_size=1"]),
    "ep2-pp2-zb-v-deferred0": (4, ["parallel.ep=2", "parallel.pp=2", "parallel.pp_schedule=zb-v",
                                   "parallel.virtual_stages=2", "parallel.pp_max_deferred=0"],
                               ["train.micro_batch_size=1"]),
    "ep2-pp2-dualpipev-deferred1": (4, ["parallel.ep=2", "parallel.pp=2",
                                        "parallel.pp_schedule=dualpipev",
                                        "parallel.virtual_stages=2", "parallel.pp_max_deferred=1"],
                                    ["train.micro_batch_size=1"]),
    "ep2-full-recompute": (2, ["parallel.ep=2", "train.recompute=full"], []),
    # Full recompute under zero-bubble: the weight half replays the layer after other micro-batches
    # used the replay set; the experts' rows stay keyed by the micro-batch.
    "ep2-pp2-zb-h1-full": (4, ["parallel.ep=2", "parallel.pp=2", "parallel.pp_schedule=zb-h1",
                               "train.recompute=full"], []),
    "ep2-bias": (2, ["parallel.ep=2"], BIAS),
    # Context parallelism with MoE (dropless; also the cp layouts above): each cp rank routes its
    # chunks' tokens; the aux loss's per-sequence expert counts are summed over the cp group.
    # Under ep the experts split over consecutive ranks of the dp x cp group (cp2-ep2: the two
    # chunks' ranks share out the experts).
    "cp2-full-recompute": (2, ["parallel.cp=2", "train.recompute=full"], []),
    "cp2-bias": (2, ["parallel.cp=2"], BIAS),
    "cp2-ep2": (2, ["parallel.cp=2", "parallel.ep=2"], []),
    "cp2-ep2-dp2": (4, ["parallel.cp=2", "parallel.ep=2"], []),
    "cp2-ep4-dp2": (4, ["parallel.cp=2", "parallel.ep=4"], []),
    "cp2-ep2-pp2-zb-h1": (4, ["parallel.cp=2", "parallel.ep=2", "parallel.pp=2",
                              "parallel.pp_schedule=zb-h1"], []),
    # MoE under tp (with sequence parallelism): each tp rank routes its own rows (half a sequence
    # at tp 4 or with one-sequence micro-batches) through experts replicated over tp.
    "tp4-sp": (4, ["parallel.tp=4", "parallel.sequence_parallel=true"], ["model.n_kv_heads=4"]),
    "tp2-sp-dp2": (4, ["parallel.tp=2", "parallel.sequence_parallel=true"], []),
    "tp2-sp-accum4": (2, ["parallel.tp=2", "parallel.sequence_parallel=true",
                          "train.micro_batch_size=1"], []),
    "tp2-sp-pp2": (4, ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.pp=2",
                       "parallel.pp_schedule=zb-h1"], []),
    "tp2-sp-full-recompute": (2, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                  "train.recompute=full"], []),
    "tp2-sp-bias": (2, ["parallel.tp=2", "parallel.sequence_parallel=true"], BIAS),
    "ep2-tp2-sp-group": (4, ["parallel.ep=2", "parallel.tp=2", "parallel.sequence_parallel=true"],
                         GROUP),
    # ep under tp: each tp coordinate's ep group exchanges its own rows; the experts' gradients
    # reduce over the ranks holding the same experts at any tp coordinate.
    "ep2-tp2-sp": (4, ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=2"], []),
    "cp2-ep2-tp2-sp": (4, ["parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                           "parallel.ep=2"], []),
    "ep2-tp2-sp-pp2": (8, ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=2",
                           "parallel.pp=2", "parallel.pp_schedule=zb-h1"], []),
    # ZeRO under tp: the router and expert stacks (replicated over tp, each tp rank's gradient a
    # part of their sum) sharded over tp x dp x cp, or under ep over the expert-data group x tp;
    # at tp2-sp-zero1 that group is the tp pair alone, the other parameters' a group of one.
    "tp2-sp-zero1": (2, ["parallel.tp=2", "parallel.sequence_parallel=true",
                         "parallel.zero_stage=1"], []),
    "tp2-sp-zero2-dp2": (4, ["parallel.tp=2", "parallel.sequence_parallel=true",
                             "parallel.zero_stage=2", "train.micro_batch_size=1"], []),
    "tp2-sp-zero3-dp2": (4, ["parallel.tp=2", "parallel.sequence_parallel=true",
                             "parallel.zero_stage=3"], []),
    "tp4-sp-zero3": (4, ["parallel.tp=4", "parallel.sequence_parallel=true",
                         "parallel.zero_stage=3"], ["model.n_kv_heads=4"]),
    "ep2-tp2-sp-zero1": (4, ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=2",
                             "parallel.zero_stage=1"], []),
    "ep2-tp2-sp-zero3-dp4": (8, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                 "parallel.ep=2", "parallel.zero_stage=3"], []),
    "cp2-tp2-sp-zero3": (4, ["parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                             "parallel.zero_stage=3"], []),
    "tp2-sp-zero1-pp2": (4, ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.pp=2",
                             "parallel.pp_schedule=zb-h1", "parallel.zero_stage=1"], []),
    "capacity-tp2-sp-zero2-dp2": (4, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                      "parallel.zero_stage=2"],
                                  ["model.moe.capacity_factor=1.0"]),
    # Capacity under cp and tp: each assignment ranked among the whole sequence's (every chunk's
    # counts; tp4-sp holds half a sequence per rank).
    "capacity-tp2-sp": (2, ["parallel.tp=2", "parallel.sequence_parallel=true"],
                        ["model.moe.capacity_factor=1.0"]),
    "capacity-tp4-sp": (4, ["parallel.tp=4", "parallel.sequence_parallel=true"],
                        ["model.moe.capacity_factor=1.0", "model.n_kv_heads=4"]),
    "capacity-cp2-tp2-sp": (4, ["parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"],
                            ["model.moe.capacity_factor=1.0"]),
    "capacity-cp2": (2, ["parallel.cp=2"], ["model.moe.capacity_factor=1.0"]),
    "capacity-cp4": (4, ["parallel.cp=4"], ["model.moe.capacity_factor=1.0"]),
    "capacity-cp2-ep2-dp2": (4, ["parallel.cp=2", "parallel.ep=2"],
                             ["model.moe.capacity_factor=1.0"]),
    "capacity-cp2-ulysses-zero3-dp2": (4, ["parallel.cp=2", "parallel.cp_impl=ulysses",
                                           "parallel.zero_stage=3"],
                                       ["model.moe.capacity_factor=1.0"]),
    # ZeRO under ep: the expert stacks' rows sharded over the expert-data-parallel group, the
    # other parameters' over dp (x cp); at ep = dp the edp group is one rank.
    "ep2-zero1-dp4": (4, ["parallel.ep=2", "parallel.zero_stage=1"], []),
    "ep2-zero2-dp4": (4, ["parallel.ep=2", "parallel.zero_stage=2", "train.micro_batch_size=1"],
                      []),
    "ep2-zero3-dp4": (4, ["parallel.ep=2", "parallel.zero_stage=3"], []),
    "ep4-zero3-dp4": (4, ["parallel.ep=4", "parallel.zero_stage=3"], []),
    "ep2-zero3-dp2": (2, ["parallel.ep=2", "parallel.zero_stage=3"], []),
    "ep2-zero1-pp2": (4, ["parallel.ep=2", "parallel.zero_stage=1", "parallel.pp=2"], []),
    "ep2-zero3-bias": (4, ["parallel.ep=2", "parallel.zero_stage=3"], BIAS),
    "cp2-ep2-zero3-dp2": (4, ["parallel.cp=2", "parallel.ep=2", "parallel.zero_stage=3"], []),
    # Hybrid sharding (HSDP): ZeRO within groups of N consecutive dp ranks (x cp), the shards'
    # gradients all-reduced across the dp/N replicas once a step (stage 2 with accumulation:
    # after the last micro-batch). N = 1: every shard group one rank (tp2: the tp pair; cp2: the
    # cp pair); under ep the shard group holds the ep group; under pp the tied embedding's rows.
    "hsdp2-zero1-dp4": (4, ["parallel.zero_stage=1", "parallel.zero_shard_group=2"], []),
    "hsdp2-zero2-dp4": (4, ["parallel.zero_stage=2", "parallel.zero_shard_group=2",
                            "train.micro_batch_size=1"], []),
    "hsdp2-zero3-dp4": (4, ["parallel.zero_stage=3", "parallel.zero_shard_group=2"], []),
    "hsdp1-cp2-dp2-zero3": (4, ["parallel.cp=2", "parallel.zero_stage=3",
                                "parallel.zero_shard_group=1"], []),
    "hsdp1-tp2-dp2-zero2": (4, ["parallel.tp=2", "parallel.zero_stage=2",
                                "parallel.zero_shard_group=1"], []),
    "hsdp1-pp2-dp2-zero1": (4, ["parallel.pp=2", "parallel.zero_stage=1",
                                "parallel.zero_shard_group=1"], []),
    "hsdp2-ep2-zero1-dp4": (4, ["parallel.ep=2", "parallel.zero_stage=1",
                                "parallel.zero_shard_group=2"], []),
    "hsdp2-ep2-zero3-dp4": (4, ["parallel.ep=2", "parallel.zero_stage=3",
                                "parallel.zero_shard_group=2"], []),
    "hsdp1-tp2-sp-zero3-dp2": (4, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                   "parallel.zero_stage=3", "parallel.zero_shard_group=1"], []),
    # ZeRO++'s quantised weights (qwZ) against the single rank quantising alike: with blocks of 16
    # every parameter's shard of rows at dp 2 and 4 (and of the shard group of 2) is whole
    # blocks of the single rank's, so each rank gathers exactly the codes one rank makes. At
    # fixed weights (QW16's learning rate of 1e-30), so that summation-order differences in the
    # updated masters cannot move a weight across a code boundary (one code is 1/127 of its
    # block's largest weight) and the comparison sees the gathered weights themselves.
    "qw16-zero3-dp2": (2, [], QW16),
    "qw16-zero3-dp4": (4, [], QW16),
    "qw16-hsdp2-zero3-dp4": (4, ["parallel.zero_shard_group=2"], QW16),
    "qw16-pp2-zero3-dp2": (4, ["parallel.pp=2"], QW16),
    "qw16-ep2-zero3-dp4": (4, ["parallel.ep=2"], QW16),
    "qw16-hpz2-zero3-dp4": (4, ["parallel.zero_hierarchical_partition=2"], QW16),
    # ZeRO++'s hierarchical partitioning (hpZ): a secondary copy of the gathered weights sharded
    # within groups of N dp ranks, every later gather of a unit until the update from it (with
    # accumulation: the other micro-batches' forward too); with hybrid sharding inside its shard
    # groups; N = 1 keeps it whole on each rank (of the cp, tp or ep pair).
    "hpz2-zero3-dp4": (4, ["parallel.zero_stage=3", "parallel.zero_hierarchical_partition=2"],
                       []),
    "hpz2-zero3-dp4-accum": (4, ["parallel.zero_stage=3", "parallel.zero_hierarchical_partition=2",
                                 "train.micro_batch_size=1"], []),
    "hpz1-hsdp2-zero3-dp4": (4, ["parallel.zero_stage=3", "parallel.zero_shard_group=2",
                                 "parallel.zero_hierarchical_partition=1"], []),
    "hpz1-pp2-zero3-dp2": (4, ["parallel.pp=2", "parallel.zero_stage=3",
                               "parallel.zero_hierarchical_partition=1"], []),
    "hpz1-cp2-zero3-dp2": (4, ["parallel.cp=2", "parallel.zero_stage=3",
                               "parallel.zero_hierarchical_partition=1"], []),
    "hpz2-ep2-zero3-dp4": (4, ["parallel.ep=2", "parallel.zero_stage=3",
                               "parallel.zero_hierarchical_partition=2"], []),
    "hpz1-tp2-sp-zero3-dp2": (4, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                  "parallel.zero_stage=3",
                                  "parallel.zero_hierarchical_partition=1"], []),
    # ZeRO++'s quantised gradients (qgZ, blocks of 1: QG1): one all-to-all over the group; two
    # with hpZ's groups (within pairs, then across: dp 4 and hpZ 2), inside hybrid sharding's
    # shard groups (hpZ 1: a first hop of one rank, then across the pair), over ep's edp groups,
    # with accumulation, pp, cp and tp.
    "qg1-zero3-dp4": (4, QG1, []),
    "qg1-zero3-dp3": (3, QG1, GBS6),
    "qg1-hpz2-zero3-dp4": (4, QG1 + ["parallel.zero_hierarchical_partition=2"], []),
    "qg1-hpz2-zero3-dp4-accum": (4, QG1 + ["parallel.zero_hierarchical_partition=2",
                                           "train.micro_batch_size=1"], []),
    "qg1-hpz1-hsdp2-zero3-dp4": (4, QG1 + ["parallel.zero_hierarchical_partition=1",
                                           "parallel.zero_shard_group=2"], []),
    "qg1-pp2-zero3-dp2": (4, QG1 + ["parallel.pp=2"], []),
    # Two hops without hpZ's copy (qgZ's own groups), and in groups other than hpZ's.
    "qg1-hop2-zero3-dp4": (4, QG1 + ["parallel.zero_quantized_gradients_group=2"], []),
    "qg1-hop2-hpz1-zero3-dp4": (4, QG1 + ["parallel.zero_quantized_gradients_group=2",
                                          "parallel.zero_hierarchical_partition=1"], []),
    "qg1-hpz1-cp2-zero3-dp2": (4, QG1 + ["parallel.cp=2",
                                         "parallel.zero_hierarchical_partition=1"], []),
    "qg1-hpz2-ep2-zero3-dp4": (4, QG1 + ["parallel.ep=2",
                                         "parallel.zero_hierarchical_partition=2"], []),
    "qg1-tp2-sp-zero3-dp2": (4, QG1 + ["parallel.tp=2", "parallel.sequence_parallel=true"], []),
    # Capacity dropping at a fixed dp 4: ep 1, 2 and 4 must give the same losses.
    "capacity-ep2-dp4": (4, ["parallel.ep=2"], ["model.moe.capacity_factor=1.0"]),
    "capacity-ep4-dp4": (4, ["parallel.ep=4"], ["model.moe.capacity_factor=1.0"]),
}
# Small buckets, so DDP overlaps several all-reduces with backward even on a tiny model.
COMMON = ["parallel.bucket_mb=0.05", "train.threads=1", "log.progress=false"]


def train_run(args, out, ranks, sets):
    steps = train(args, out, ranks, COMMON + sets, dump_final=True)
    return steps, np.fromfile(os.path.join(out, "final", "params.bin"), dtype="<f4")


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def main():
    args = parse_args(lambda ap: ap.add_argument("--layout", required=True, choices=sorted(LAYOUTS)))

    os.makedirs(args.workdir, exist_ok=True)
    ranks, sets, base = LAYOUTS[args.layout]
    base = base + args.sets
    # (Named by each override's last key part and its whole value: "factor=4.0".)
    single = "single" + ("-" + "-".join(b.split("=")[0].split(".")[-1] + "=" + b.split("=", 1)[1]
                                        for b in base) if base else "")
    ref_steps, ref_params = train_run(args, os.path.join(args.workdir, single), 1, base)
    steps, params = train_run(args, os.path.join(args.workdir, args.layout), ranks, sets + base)

    failures = []
    if len(steps) != len(ref_steps):
        failures.append(f"{len(steps)} steps vs {len(ref_steps)} single-rank")
    # MoE runs also report their router losses, expert load and dropped share (layout-free).
    worst = {"loss": 0.0, "grad_norm": 0.0, "val_loss": 0.0, "mtp_loss": 0.0, "moe_aux": 0.0,
             "moe_z": 0.0, "moe_load_max": 0.0, "moe_load_min": 0.0, "moe_dropped": 0.0}
    for s, r in zip(steps, ref_steps):
        tol = 1e-5 if s["step"] == 1 else 1e-4
        for key in worst:
            if key not in r:
                continue
            d = rel(s[key], r[key])
            worst[key] = max(worst[key], d)
            if d > tol:
                failures.append(f"step {s['step']} {key}: {s[key]!r} vs single-rank {r[key]!r} "
                                f"(relative {d:.2e} > {tol:.0e})")
    if params.shape != ref_params.shape:
        failures.append(f"final params: {params.size} values vs {ref_params.size}")
        pdiff = float("inf")
    else:
        # Relative to the parameters' scale: max |a - b| / max |b|.
        pdiff = float(np.max(np.abs(params - ref_params)) / np.max(np.abs(ref_params)))
        if pdiff > 1e-4:
            failures.append(f"final params differ: max |a-b| / max |b| = {pdiff:.2e} > 1e-4")
    print(f"{os.path.basename(args.config)} {args.layout}: ranks {ranks}, max rel loss "
          f"{worst['loss']:.2e}, max rel grad_norm {worst['grad_norm']:.2e}, final params "
          f"{pdiff:.2e}, max rel val_loss {worst['val_loss']:.2e}"
          + (f", max rel mtp_loss {worst['mtp_loss']:.2e}" if "mtp_loss" in ref_steps[0] else "")
          + (f", max rel moe_aux {worst['moe_aux']:.2e}, moe_dropped {worst['moe_dropped']:.2e}"
             if "moe_aux" in ref_steps[0] else ""))
    finish(failures)


if __name__ == "__main__":
    main()
