"""The dev-tools layer: what the demo, the benchmarks and the tests use to drive a stack.

Never used by a running pipeline. One implementation each of: a talker over one publisher
(`talker`: as fast as possible, or realtime in a thread), the `codeclog vocode` member
launcher (`members`: log files, waiting for a log line, SIGTERM/SIGKILL, stopping once the
group committed everything), a read_committed probe of the audio topic (`probe`), one test
stack of topics, group and members (`stack`), one `percentile` (`stats`), the fault matrix
on a local cluster (`faults`, its faults in `fault_actions`) and its independent audit of the
outputs (`audit`).
"""
