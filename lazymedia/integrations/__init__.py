"""Adapters that let a serving stack use lazymedia in place of its own media layer."""
