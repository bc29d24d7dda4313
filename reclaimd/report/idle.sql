-- reclaimd report: the instance-hours behind the groups 'reserved-idle' and 'unallocated'.
--
-- Not a query of its own: `reclaimd report --detail` runs report.sql's relations (its text up
-- to its result's SELECT) followed by this SELECT, in the same engine; portable as report.sql
-- is. One row per instance-hour of an instance the meter saw whose billed GPU-hours exceed
-- those the meter attributed: which group it is in, the hour, the instance id, its purchase
-- option, the idle GPU-hours and their cost at that hour's rate.
SELECT
  kind,
  hour_start,
  resource_id,
  purchase_option,
  gpu_hours,
  cost
FROM idle
ORDER BY hour_start, resource_id, kind
