#!/usr/bin/env bash
# Rebuilds every artifact of the task, in order; each step resumes or skips what is done.
# Long steps (hours on 2 CPU cores) keep their state in $CACHE, outside the repository.
# The defaults are the settings of the shipped pair (tasks/bible_es_en/README.md).
#   tasks/bible_es_en/build.sh            # all steps
#   STEPS="drafts ship" tasks/bible_es_en/build.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
CACHE=${CACHE:-$HOME/.cache/specbeam}
DRAFT_MINUTES=${DRAFT_MINUTES:-55}
DRAFT=${DRAFT:-head}  # the draft to ship (chosen by τ, see README): head, draft_shallow_kd, ...
HEAD_MINUTES=${HEAD_MINUTES:-45}
# The translations a draft learns from: the shipped target's (a full rebuild ships the
# target first: STEPS="... target ship distill ...").
DISTILL_TARGET=${DISTILL_TARGET:-tasks/bible_es_en/models/target.pt}
STEPS=${STEPS:-"data tokenizer target distill teacher drafts head ship"}
TARGET=$CACHE/target_avg.pt

for step in $STEPS; do
  echo "== $step ($(date +%H:%M))" >&2
  case $step in
    data) $PY tasks/bible_es_en/prepare.py ;;
    tokenizer) [ -f tasks/bible_es_en/spm.model ] || $PY tasks/bible_es_en/train_tokenizer.py ;;
    target)  # 5 epochs; then on to step 2108; the mean of the two
      train=(-m specbeam.train out_dir="$CACHE/target" hydra.run.dir="$CACHE/target/hydra")
      [ -f "$CACHE/target_e5.pt" ] || { $PY "${train[@]}" max_epochs=5 &&
        cp "$CACHE/target/best.pt" "$CACHE/target_e5.pt"; }
      $PY "${train[@]}" max_steps=2108
      $PY -m specbeam.average "$TARGET" "$CACHE/target_e5.pt" "$CACHE/target/last.pt" ;;
    distill)  # the shipped target's beam-5 translations of the training sources, two
      # shards of one thread each (about 50 minutes on an idle 2-core machine)
      for shard in 0 1; do
        $PY -m specbeam.distill model.target="$DISTILL_TARGET" model.draft=none decoding=beam \
          model.tokenizer=bible_es_en_target hardware.target_dtype=bfloat16 hardware.batch_tokens=4096 hardware.threads=1 \
          shard=$shard/2 out_dir="$CACHE/distill" hydra.run.dir="$CACHE/distill/hydra$shard" &
      done
      wait
      $PY -m specbeam.distill model.target="$DISTILL_TARGET" model.tokenizer=bible_es_en_target merge_only=true \
        out_dir="$CACHE/distill" hydra.run.dir="$CACHE/distill/hydra" ;;
    teacher)  # the shipped target's top 16 at every position of that data, for both drafts
      $PY -m specbeam.teacher "$TARGET" "$CACHE/distill/train.tsv" "$CACHE/distill/teacher_top16.pt" ;;
    drafts)  # two kinds, both on the target's translations and its token distributions
      common=(time_budget_minutes="$DRAFT_MINUTES" max_epochs=8 dev_sentences=300 threads=1
              train_targets="$CACHE/distill/train.tsv" kd_teacher="$TARGET" kd_weight=0.5
              kd_cache="$CACHE/distill/teacher_top16.pt")
      $PY -m specbeam.train arch=draft_small out_dir="$CACHE/draft_small_kd" "${common[@]}" \
        hydra.run.dir="$CACHE/draft_small_kd/hydra" &
      $PY -m specbeam.train arch=draft_shallow arch.num_decoder_layers=2 shallow_over="$TARGET" \
        out_dir="$CACHE/draft_shallow_kd" "${common[@]}" hydra.run.dir="$CACHE/draft_shallow_kd/hydra"
      wait ;;
    head)  # a draft head over the shipped target's states, on the same translations
      $PY -m specbeam.train_head model.target=bible_es_en_target \
        data="$CACHE/distill/train.tsv" data_cache="$CACHE/distill/head_states.pt" \
        out_dir="$CACHE/head" time_budget_minutes="$HEAD_MINUTES" hydra.run.dir="$CACHE/head/hydra" ;;
    ship)
      $PY tasks/bible_es_en/ship.py --target "$TARGET" --draft "$CACHE/$DRAFT/best.pt" ;;
    *) echo "unknown step: $step (known: data tokenizer target distill teacher drafts head ship)" >&2; exit 2 ;;
  esac
done
