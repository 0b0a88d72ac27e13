"""`pipesim plan`'s library: the search space (space), the simulation order (estimate), costing and the
memory prune (evaluate), the figures and why each candidate lost (ranking), the search (search) and the
winner's exports (exports). docs/planner.md."""
