"""The cost floor: from a model and a machine to seconds and bytes per stage and action
(table.CostTable, model_costs.ParallelCosts), what the step adds around the pipeline, and memory."""
