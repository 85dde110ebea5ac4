"""Phase autoselect: Triton or PyTorch per operation, chosen at run time at the model's shapes -- the LM trained all-PyTorch, all-Triton and autoselected."""
