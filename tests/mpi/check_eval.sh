#!/usr/bin/env bash
# `llmtrain eval`: the loss of a checkpoint on the validation split equals the `val` loss the run
# printed at that step (bitwise at one rank, within 1e-6 relative at tp2 under mpirun), the test
# split gives another loss.
#   check_eval.sh LLMTRAIN MPIRUN CONFIG WORKDIR
set -euo pipefail
llmtrain="$1" mpirun="$2" config="$3" work="$4"
rm -rf "$work" && mkdir -p "$work"
"$llmtrain" train --config "$config" -q --set train.steps=4 --set train.eval_interval=2 \
  --set train.eval_iters=2 --set train.run_dir=\""$work/run"\" --set checkpoint.dir=\""$work/ck"\" \
  --set checkpoint.interval=2 --set optimizer.warmup_steps=1 --set train.threads=1 > /dev/null
val_at() { grep "\"step\": $1," "$work/run/metrics.jsonl" | sed 's/.*"val_loss": \([^,}]*\).*/\1/'; }
loss_of() { sed -n 's/^eval: .* loss \([^,]*\), perplexity .*/\1/p'; }
fail=0
for step in 2 4; do
  want="$(val_at $step)"
  got="$("$llmtrain" eval --checkpoint "$work/ck/step_0000000$step" --set train.threads=1 | loss_of)"
  echo "step $step: val $want, eval $got"
  [[ -n "$want" && "$got" == "$want" ]] || { echo "FAIL: eval at step $step is not the run's val"; fail=1; }
done
tp2="$("$mpirun" --oversubscribe -np 2 "$llmtrain" eval --checkpoint "$work/ck" \
  --set parallel.tp=2 --set train.threads=1 | loss_of)"
echo "tp2: eval $tp2"
awk -v a="$tp2" -v b="$(val_at 4)" 'BEGIN {d = (a - b) / b; exit !(a != "" && d < 1e-6 && d > -1e-6)}' ||
  { echo "FAIL: eval at tp2 is not within 1e-6 of the run's val"; fail=1; }
test_loss="$("$llmtrain" eval --checkpoint "$work/ck" --split test --set train.threads=1 | loss_of)"
echo "test split: $test_loss"
[[ -n "$test_loss" && "$test_loss" != "$(val_at 4)" ]] || { echo "FAIL: the test split gave the validation loss"; fail=1; }
# A run whose layout cannot be the evaluation's (tp2 with full recompute's inputs split over tp,
# train.distribute_saved_activations): eval runs it at one rank, within 1e-6 of its val.
"$mpirun" --oversubscribe -np 2 "$llmtrain" train --config "$config" -q --set train.steps=2 \
  --set train.eval_interval=2 --set train.eval_iters=2 --set train.run_dir=\""$work/dist"\" \
  --set checkpoint.dir=\""$work/dist-ck"\" --set checkpoint.interval=2 --set optimizer.warmup_steps=1 \
  --set train.threads=1 --set parallel.tp=2 --set train.recompute=\"full\" \
  --set train.distribute_saved_activations=true > /dev/null
dist_val="$(grep '"step": 2,' "$work/dist/metrics.jsonl" | sed 's/.*"val_loss": \([^,}]*\).*/\1/')"
dist="$("$llmtrain" eval --checkpoint "$work/dist-ck" --set train.threads=1 | loss_of)"
echo "tp2 distributed run: val $dist_val, eval at one rank $dist"
awk -v a="$dist" -v b="$dist_val" 'BEGIN {d = (a - b) / b; exit !(a != "" && d < 1e-6 && d > -1e-6)}' ||
  { echo "FAIL: eval of the distributed run is not within 1e-6 of its val"; fail=1; }
# A ZeRO-3 run with ZeRO++'s quantised weights and gradients (blocks of 64) and hierarchical
# partitioning at dp 2: eval resets its ZeRO options to run at one rank (exact weights: another loss than the
# run's val, which the quantised gathers computed), and at dp 2 with the same quantisation gives
# the run's val within 1e-6.
"$mpirun" --oversubscribe -np 2 "$llmtrain" train --config "$config" -q --set train.steps=2 \
  --set train.eval_interval=2 --set train.eval_iters=2 --set train.run_dir=\""$work/zpp"\" \
  --set checkpoint.dir=\""$work/zpp-ck"\" --set checkpoint.interval=2 --set optimizer.warmup_steps=1 \
  --set train.threads=1 --set parallel.zero_stage=3 --set parallel.zero_quantized_weights=true \
  --set parallel.zero_quant_block=64 --set parallel.zero_hierarchical_partition=1 \
  --set parallel.zero_quantized_gradients=true > /dev/null
zpp_val="$(grep '"step": 2,' "$work/zpp/metrics.jsonl" | sed 's/.*"val_loss": \([^,}]*\).*/\1/')"
zpp_one="$("$llmtrain" eval --checkpoint "$work/zpp-ck" --set train.threads=1 | loss_of)"
zpp_dp2="$("$mpirun" --oversubscribe -np 2 "$llmtrain" eval --checkpoint "$work/zpp-ck" \
  --set train.threads=1 --set parallel.zero_stage=3 --set parallel.zero_quantized_weights=true \
  --set parallel.zero_quant_block=64 | loss_of)"
echo "ZeRO++ run: val $zpp_val, eval at one rank $zpp_one, at dp2 quantised $zpp_dp2"
[[ -n "$zpp_one" && "$zpp_one" != "$zpp_val" ]] ||
  { echo "FAIL: eval at one rank of the qwZ run gave no loss, or the quantised one"; fail=1; }
awk -v a="$zpp_dp2" -v b="$zpp_val" 'BEGIN {d = (a - b) / b; exit !(a != "" && d < 1e-6 && d > -1e-6)}' ||
  { echo "FAIL: eval at dp2 with qwZ is not within 1e-6 of the run's val"; fail=1; }
[[ $fail -eq 0 ]] && echo "eval: checks passed"
exit $fail
