"""The artifacts stages hand each other: the paths bank and the features made from it."""
