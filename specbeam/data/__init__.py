"""What training and the apps both read and batch: tasks and their parallel text, token
sequences and batches, and translating a list of sentences with any generator."""
