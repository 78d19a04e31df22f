"""The abstention benchmark: answers to questions the passages answer and to questions they do not."""
