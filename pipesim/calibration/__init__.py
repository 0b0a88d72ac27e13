"""The calibration annex: measure this machine, fit the simulator's figures to it, report how well it predicts.

One direction of flow: `launch` runs the executor under torchrun (its worker is `runs`; the runs are
planned in `plan`) -> `measured` loads and reads the kept timelines -> `fit` inverts the cost model
on their actions and `refine` sets the host figures on whole steps -> `calibrate` writes the hardware
file the simulator loads -> `validation` predicts a grid of runs with it (`isolated`: the naive
single-process figures, for contrast) and `report` / `plots` write docs/validation.md; `campaign`
drives that whole flow for `pipesim validate`. A module imports only earlier ones
(tests/test_calibration_flow.py); the package is a client of the simulator and the cost model, and
nothing below the CLI imports it.
"""
