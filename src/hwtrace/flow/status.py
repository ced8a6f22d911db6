"""Status flags the flow decoders return next to their results
(libipt's enum pt_status_flag).  They are not errors: an event is
pending, the IP is suppressed (tracing disabled), the end of the trace
was reached."""

IP_SUPPRESSED = 1 << 0
EVENT_PENDING = 1 << 1
EOS = 1 << 2

# Internal (never returned to users): an error found while reading ahead
# waits for the decoder to proceed (libipt 2.3 reports it then).
DEFERRED = 1 << 7
