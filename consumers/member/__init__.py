"""The live consumer-group member (`codeclog vocode`): one idea per module.

- `service`: the member's life and its loop: start, steps, failures, stop;
- `intake`: its consumer: poll, decode while polling, pause, rebalance callbacks, offsets;
- `writes`: what a step writes (audio, dead letters, checkpoints), a pure function;
- `boundary`: the transaction boundary (`TransactionBoundary`), as the member sees it;
- `transaction`: its one implementation (`Transactions`), with `commit` (the commit in flight)
  and `producer_config` (the transactional producer's settings);
- `progress`: the checkpoints on the compacted progress topic, written and read back;
- `recovery`: state rebuilt from the log on assignment;
- `startup`: the cluster facts read once at start, the stop signals;
- `metrics`: the Prometheus metrics.
"""
