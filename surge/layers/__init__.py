"""Shared model layers: linear, embedding, norm, rotary, activation, attention, sampler."""
