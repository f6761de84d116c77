"""A small model that is not spotwise's GPT, trained through ``spotwise.train.TrainSpec``."""
