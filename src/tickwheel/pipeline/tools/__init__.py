"""Tools around the engines: the event-log generator (:mod:`.generator`) and the run
reports (:mod:`.report`)."""
