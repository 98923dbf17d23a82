"""Scoring translations the way the literature does (:mod:`.bleu`), running generation
from a checkpoint (:mod:`.generate`), the end-to-end report (:mod:`.evaluate`) and the
LRC coefficient trajectories of a run (:mod:`.lrc`)."""
