"""Training targets and drafts: the trainer, distillation data, teacher distributions,
checkpoint averaging and draft-target agreement."""
