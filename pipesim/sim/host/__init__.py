"""The simulator's host plug-ins: how CPU processes share a host's cores (fluidly, or in time slices), every replica's
processes counted (copies).

Used only for hardware with a host profile (`pipesim.hardware.machine.HostProfile`); the simulator picks one.
"""
