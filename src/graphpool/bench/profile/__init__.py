"""`graphpool bench profile`: the kernels of a decode step per layer, and a prefill step's time."""
