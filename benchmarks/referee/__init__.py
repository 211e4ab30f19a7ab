"""The referee: every serving claim measured with the same information for every arm and none of the future.

`python -m benchmarks.referee` (see `__main__.py`). The parts: `sides` (train / dev / locked task splits and the
model trained on the train side), `slo` (SLOs fixed from the training side), `tooltime` (the stated tool-time
distribution), `ready` (predictions made when a stage becomes ready, from finished ancestors only), `arms` (what
each arm is), `grid` (the runs), `stats` (paired, seed-stratified bootstrap intervals), `report` (JSON, Markdown,
plot).
"""
