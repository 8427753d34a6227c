"""Dataset formats spark_cnn reads and writes beyond plain image files: the Petastorm layout (written and read
natively, without the petastorm library) and decoded-pixel rows (Spark's image source, NumPy arrays)."""
