"""Input and output files: files written whole (:mod:`.files`), the input directory
and its reader (:mod:`.input_dir`, :mod:`.log_reader`), the Parquet outputs and their
compaction (:mod:`.outputs`, :mod:`.compaction`), and the lock of one owner per run
directory (:mod:`.ownership`)."""
