"""The apps' machinery: configs, decodings and hardware tuning, text I/O and side-by-side
comparison; and the Hydra apps themselves, those of training included."""
