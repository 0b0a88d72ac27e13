"""The schedule IR: actions, kinds, schedules, the lowering to point-to-point actions, the
dependency rules, the task graph and the checks that run before anything is simulated or executed."""
