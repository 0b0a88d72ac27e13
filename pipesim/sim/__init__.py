"""The simulator floor: the SimPy engine that runs each rank's lowered program, its plug-ins,
the result, the setup that joins costs and machine, and sweeps."""
