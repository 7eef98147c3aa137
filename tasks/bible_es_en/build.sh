#!/usr/bin/env bash
# Rebuilds every artifact of the task, in order; each step resumes or skips what is done.
# Long steps (hours on 2 CPU cores) keep their state in $CACHE, outside the repository.
#   tasks/bible_es_en/build.sh            # all steps
#   STEPS="drafts ship" tasks/bible_es_en/build.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
CACHE=${CACHE:-$HOME/.cache/specbeam}
TARGET_EPOCHS=${TARGET_EPOCHS:-12}
DRAFT_EPOCHS=${DRAFT_EPOCHS:-4}
DRAFT=${DRAFT:-draft_shallow_kd}  # the draft to ship (chosen by τ on dev, see README)
STEPS=${STEPS:-"data tokenizer target distill drafts ship"}

for step in $STEPS; do
  echo "== $step ($(date +%H:%M))" >&2
  case $step in
    data) $PY tasks/bible_es_en/prepare.py ;;
    tokenizer) [ -f tasks/bible_es_en/spm.model ] || $PY tasks/bible_es_en/train_tokenizer.py ;;
    target)
      $PY -m specbeam.train out_dir="$CACHE/target" max_epochs="$TARGET_EPOCHS" \
        hydra.run.dir="$CACHE/target/hydra" ;;
    distill)  # the target's beam-5 translations of the training sources
      $PY -m specbeam.distill model.target="$CACHE/target/best.pt" decoding=beam \
        hardware.batch_tokens=4096 out_dir="$CACHE/distill" hydra.run.dir="$CACHE/distill/hydra" ;;
    drafts)  # two kinds, both on the target's translations and its token distributions
      common=(max_epochs="$DRAFT_EPOCHS" train_targets="$CACHE/distill/train.tsv"
              kd_teacher="$CACHE/target/best.pt" kd_weight=0.5)
      $PY -m specbeam.train arch=draft_small out_dir="$CACHE/draft_small_kd" "${common[@]}" \
        hydra.run.dir="$CACHE/draft_small_kd/hydra"
      $PY -m specbeam.train arch=draft_shallow shallow_over="$CACHE/target/best.pt" \
        out_dir="$CACHE/draft_shallow_kd" "${common[@]}" hydra.run.dir="$CACHE/draft_shallow_kd/hydra" ;;
    ship)
      $PY tasks/bible_es_en/ship.py --target "$CACHE/target/best.pt" --draft "$CACHE/$DRAFT/best.pt"
      $PY scripts/plot_training.py --out tasks/bible_es_en/training.png target="$CACHE/target" \
        "$DRAFT=$CACHE/$DRAFT" ;;
    *) echo "unknown step: $step (known: data tokenizer target distill drafts ship)" >&2; exit 2 ;;
  esac
done
