"""Training targets and drafts: the trainers, teacher distributions, checkpoint averaging
and draft-target agreement."""
