"""The event log's contract: the row types and their parsing (:mod:`.events`), each
option's range (:mod:`.limits`) and declaration (:mod:`.options`), and which partition
a row goes to (:mod:`.routing`)."""
