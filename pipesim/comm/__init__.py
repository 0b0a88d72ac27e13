"""Collectives: NCCL's algorithms on the node/network hierarchy, the CPU ring formulas, a
collective overlapped with a GEMM, and the framework's communication switches."""
