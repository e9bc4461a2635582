#!/bin/bash
# experiment: live correction step RATE (0.003, 0.03, 0.1 in the runs) (default 0.01)
cfg="$2"
sed -i 's/^calibration_rate = .*/calibration_rate = RATE/' "$cfg"
exec "$(dirname "$0")/headroom-predictor.real" "$@"
