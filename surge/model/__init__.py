"""Model definitions (one file per architecture), the registry and the weight loader."""
