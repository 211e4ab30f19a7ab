"""Admission: may a stage start on a node now, and with what reservation.

`sizing` sizes a stage's reserve (the one prediction → tokens rule, the reservation modes); `pages` admits a stage
whose reserve fits in free pages; `aimd` is MARS's AIMD session window.
"""
from serving.admission.aimd import AIMDConfig, AIMDWindow
from serving.admission.pages import PageAdmission
from serving.admission.sizing import (DEFAULT_RHO, ReservationMode, is_calibrated, output_tokens_to_map,
                                      reserve_output_tokens)

__all__ = ["AIMDConfig", "AIMDWindow", "DEFAULT_RHO", "PageAdmission", "ReservationMode", "is_calibrated",
           "output_tokens_to_map", "reserve_output_tokens"]
