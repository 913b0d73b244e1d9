-- Reads the probe's watermark, locking its row for the probe's transaction.
SELECT watermark FROM {{probe}} FOR UPDATE
