"""The apps' machinery: configs, decodings and hardware tuning, text I/O, the task's
data, batched inference and side-by-side comparison; and the Hydra apps themselves."""
