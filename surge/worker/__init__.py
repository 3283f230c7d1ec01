"""The worker side of a step: tensors in, forward pass, sampled tokens out."""
