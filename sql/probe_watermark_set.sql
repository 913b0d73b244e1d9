-- Moves the probe's watermark after an alert went out.
UPDATE {{probe}} SET watermark = $1
