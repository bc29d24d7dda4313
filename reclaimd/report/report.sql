-- reclaimd report: allocation, restart waste and restart overhead, priced with the cloud bill
-- (FOCUS).
--
-- Portable SQL (DuckDB, Athena/Trino, BigQuery): no casts, no engine functions, no
-- parameters. It reads six relations; `reclaimd report` builds them in DuckDB, the Trino
-- test runs this same text over the same Parquet files, and docs/ledger.md shows the views
-- to create over the ledger and the bill where they live.
--
--   alloc  (hour_start, resource_id, node, sku, purchase_option, grp, gpu_hours,
--           mig_gpu_hours, mig_profile_hours, hbm_gb_hours, node_gpus)
--          the allocation meter's rows (reclaimd.allocation/v1), one per instance-hour and
--          label set; grp is the label the report groups by (tenant, queue, ...), or
--          'unattributed'. resource_id is the instance id; a GCE instance's is
--          'project/name' (names are unique within a project only).
--   waste  (event_id, notice_id, gang_id, hour_start, resource_id, node, sku,
--           purchase_option, grp, gpu_seconds, outcome, deadline_met)
--          restart-waste events (reclaimd.restart-waste/v2), one row per x_WasteByInstance
--          part; hour_start is the hour the ranks stopped in.
--   overhead (event_id, notice_id, gang_id, hour_start, resource_id, node, sku,
--             purchase_option, grp, gpu_seconds, source)
--          restart-overhead events (reclaimd.restart-overhead/v1), one row per
--          x_RestartOverheadByInstance part (the replacement's instances); hour_start is the
--          hour the replacement was training again in (x_RestartedAt); source is
--          'sdk-first-step' or 'pods-ready'. May be empty.
--   focus  (ChargePeriodStart, ResourceId, ProviderName, ServiceCategory, ChargeCategory,
--           ConsumedUnit, SkuId, SkuMeter, PricingCategory, EffectiveCost, ListCost,
--           ConsumedQuantity)
--          the hourly FOCUS cost-and-usage export, every row; ResourceId reduced to the
--          instance id (GCE: 'project/name'). Every column the compute-row rule tests must
--          be there (reclaimd refuses a file without one); SkuMeter and ListCost may be NULL
--          where the export has none. A Google row's SkuMeter is its SKU's description
--          (Google's FOCUS export: ChargeDescription) and its ServiceCategory 'Compute' for
--          ServiceName 'Compute Engine' (that export has no ServiceCategory).
--   rates  (sku, purchase_option, usd_per_gpu_hour)   optional, may be empty
--   skus   (sku, gpus)                                GPUs per instance type
--
-- Compute rows (docs/ledger.md, "Which bill rows price a GPU-hour"): ChargeCategory Usage,
-- ServiceCategory Compute, ConsumedUnit a time (hours, seconds) or a memory-time (GiB-hours,
-- byte-seconds); data transfer, storage, support, tax, credits and commitment purchases are
-- not, nor is a row that leaves one of the three blank (it is not shown to be compute). An instance-hour's GPU-hours are its instance-hours x GPUs (AWS and others) or the
-- hours of its GPU SKU rows (Google: SkuMeter, the SKU's description, names a GPU; its core
-- and RAM SKUs are apportioned over them; a "Spot Preemptible" SKU is Dynamic). A GPU-hour costs the instance-hour's compute EffectiveCost / its
-- GPU-hours, and its PricingCategory is that of the rows that carry the GPU-hours (mixed:
-- Committed, else Dynamic, else Standard; see `bill`). Without
-- a bill row it costs the rates file's figure for its SKU and purchase option. The
-- on-demand price of a SKU is the rates file's on_demand figure, else the bill's Standard
-- rows for that SKU, else the instance-hour's ListCost (FOCUS: the list price).
--
-- Restart waste and restart overhead parts are priced alike (`restart_priced`): on the
-- meter's id of their node's instance, at the hour's rate, else the instance's average rate
-- over the window, else the rates file. Restart waste (progress lost, to be computed again)
-- is added to effective_cost. Restart overhead is NOT: the replacement's pods hold their
-- GPUs while they restore, so the meter already charged those GPU-hours as allocation;
-- restart_overhead_gpu_hours / _cost say how much of the allocated cost went on restarting
-- (a breakdown), and adding them would count those GPU-hours twice. For the same reason an
-- unpriced overhead part is not in unpriced_gpu_hours (its hours are the allocation's), and
-- notices and gangs_hit count the restart-waste events only.
--
-- Reserved idle and unallocated: per instance-hour of an instance the meter saw, its
-- GPU-hours minus those the meter attributed, at its rate: the group 'reserved-idle' for
-- committed capacity (PricingCategory Committed, or a reserved or capacity-block node),
-- 'unallocated' for the rest; never spread over tenants (see `idle`).
--
-- Cost (a month of a 2,000-node fleet: 6.6 M bill rows, 2.9 M allocation rows): the bill is
-- read once and grouped once, to its instance-hours; every other step works on those or on
-- the allocation's rows. Each join has the smaller relation on its right, the side a hash
-- join builds its table on (the bill's instance-hours, not the allocation's rows; the
-- restart parts, waste and overhead together, not the instance-hours: a RIGHT JOIN), and
-- DuckDB keeps the joins as written (engine.run_sql). The meter's instances are numbered
-- (`instances.iid`): the allocation's joins and groups per instance-hour (`alloc_priced`,
-- `held`, `idle_hours`) key on that number and the hour, not on the instance id's text.

WITH
instances AS (
  SELECT
    resource_id,
    ROW_NUMBER() OVER (ORDER BY resource_id) AS iid,
    gpus,
    sku,
    purchase_option
  FROM (
    SELECT
      resource_id,
      MAX(node_gpus) AS gpus,
      MAX(sku) AS sku,
      MAX(purchase_option) AS purchase_option
    FROM alloc
    WHERE resource_id IS NOT NULL
    GROUP BY resource_id
  ) t
),
bill_rows AS (
  SELECT
    ResourceId AS resource_id,
    ChargePeriodStart AS hour_start,
    SkuId,
    PricingCategory,
    EffectiveCost,
    ListCost,
    ConsumedQuantity,
    LOWER(ConsumedUnit) AS unit,
    LOWER(PricingCategory) AS pricing,
    CASE WHEN LOWER(ProviderName) LIKE 'google%' THEN 1 ELSE 0 END AS is_google,
    CASE WHEN LOWER(SkuMeter) LIKE '%gpu%' THEN 1 ELSE 0 END AS names_gpu,
    -- Google bills a Spot (or preemptible) VM's GPU, core and RAM under SKUs of their own,
    -- "Spot Preemptible Nvidia H100 80GB GPU running in Americas": spot whatever its
    -- PricingCategory says (Google's FOCUS view calls every row without a commitment
    -- Standard, which would make spot rates the on-demand reference)
    CASE WHEN LOWER(SkuMeter) LIKE 'spot preemptible %' OR LOWER(SkuMeter) LIKE 'preemptible %'
      THEN 1 ELSE 0 END AS names_spot
  FROM focus
  WHERE ResourceId IS NOT NULL
    -- FOCUS values, in any case (Google's FOCUS view writes 'usage')
    AND LOWER(ChargeCategory) = 'usage'
    AND LOWER(ServiceCategory) = 'compute'
),
compute_rows AS (
  SELECT
    resource_id,
    hour_start,
    SkuId,
    CASE
      WHEN pricing = 'committed' THEN 3
      WHEN pricing = 'dynamic' OR is_google * names_spot = 1 THEN 2
      WHEN pricing = 'standard' THEN 1
      ELSE 0
    END AS pricing_rank,
    EffectiveCost,
    ListCost,
    CASE
      WHEN unit IN ('s', 'second', 'seconds') THEN ConsumedQuantity / 3600.0
      ELSE ConsumedQuantity
    END AS quantity_hours,
    CASE
      WHEN is_google = 1 THEN 0
      WHEN unit IN ('h', 'hr', 'hrs', 'hour', 'hours', 's', 'second', 'seconds') THEN 1
      ELSE 0
    END AS is_instance_row,
    is_google * names_gpu AS is_gpu_sku_row
  FROM bill_rows
  WHERE unit IN ('h', 'hr', 'hrs', 'hour', 'hours', 's', 'second', 'seconds')
    OR unit LIKE '%hour%'
    OR unit LIKE '%second%'
),
-- The hour's PricingCategory, from the rows carrying its GPU-hours: Committed if any is (an
-- hour partly covered by a savings plan or reservation: its idle GPUs are paid for either
-- way, so they are reserved idle), else Dynamic if any is, else Standard if any is (an
-- on-demand reference price only when every GPU row is on-demand). As a rank, 3 to 0: one
-- integer MAX, where the names cost a string aggregate per condition.
bill AS (
  SELECT
    resource_id,
    hour_start,
    MAX(CASE WHEN is_instance_row + is_gpu_sku_row > 0 THEN SkuId END) AS bill_sku,
    MAX(CASE WHEN is_instance_row + is_gpu_sku_row > 0 THEN pricing_rank END) AS pricing_rank,
    SUM(EffectiveCost) AS cost,
    SUM(ListCost) AS list_cost,
    SUM(CASE WHEN is_instance_row = 1 THEN quantity_hours ELSE 0 END) AS instance_hours,
    SUM(CASE WHEN is_gpu_sku_row = 1 THEN quantity_hours ELSE 0 END) AS gpu_sku_hours
  FROM compute_rows
  GROUP BY resource_id, hour_start
),
bill_gpu_hours AS (
  SELECT
    b.resource_id,
    b.hour_start,
    i.iid,
    COALESCE(i.sku, b.bill_sku) AS sku,
    b.pricing_rank,
    b.cost,
    b.list_cost,
    COALESCE(b.instance_hours * COALESCE(i.gpus, s.gpus), 0) + b.gpu_sku_hours AS gpu_hours
  FROM bill b
  LEFT JOIN instances i ON i.resource_id = b.resource_id
  -- the SKU's GPUs only where the meter did not give the instance's
  LEFT JOIN skus s ON s.sku = CASE WHEN i.gpus IS NULL THEN COALESCE(i.sku, b.bill_sku) END
),
bill_rate AS (
  SELECT
    resource_id,
    hour_start,
    iid,
    sku,
    pricing_rank,
    gpu_hours,
    cost / gpu_hours AS rate,
    list_cost / gpu_hours AS list_rate
  FROM bill_gpu_hours
  WHERE gpu_hours > 0
),
od_bill AS (
  SELECT sku, AVG(rate) AS rate
  FROM bill_rate
  WHERE pricing_rank = 1
  GROUP BY sku
),
od_file AS (
  SELECT sku, MAX(usd_per_gpu_hour) AS rate
  FROM rates
  WHERE purchase_option = 'on_demand'
  GROUP BY sku
),
instance_rate AS (
  SELECT resource_id, AVG(rate) AS rate
  FROM bill_rate
  GROUP BY resource_id
),
-- the instance-hours of the instances the meter saw
seen_hours AS (
  SELECT iid, hour_start, pricing_rank, gpu_hours, rate, list_rate
  FROM bill_rate
  WHERE iid IS NOT NULL
),
alloc_priced AS (
  SELECT
    a.grp,
    a.purchase_option,
    a.gpu_hours,
    a.mig_profile_hours,
    a.hbm_gb_hours,
    (a.gpu_hours + a.mig_gpu_hours) * COALESCE(br.rate, r.usd_per_gpu_hour) AS cost,
    (a.gpu_hours + a.mig_gpu_hours)
      * COALESCE(odf.rate, odb.rate, br.list_rate, br.rate, r.usd_per_gpu_hour) AS od_cost,
    CASE WHEN COALESCE(br.rate, r.usd_per_gpu_hour) IS NULL
      THEN a.gpu_hours + a.mig_gpu_hours ELSE 0 END AS unpriced_gpu_hours
  FROM alloc a
  LEFT JOIN instances ai ON ai.resource_id = a.resource_id
  LEFT JOIN seen_hours br ON br.iid = ai.iid AND br.hour_start = a.hour_start
  LEFT JOIN rates r ON r.sku = a.sku AND r.purchase_option = a.purchase_option
  LEFT JOIN od_file odf ON odf.sku = a.sku
  LEFT JOIN od_bill odb ON odb.sku = a.sku
),
-- the allocation's rows summed per group and purchase option, before the columns by option
alloc_by_option AS (
  SELECT
    grp,
    purchase_option,
    SUM(gpu_hours) AS gpu_hours,
    SUM(mig_profile_hours) AS mig_profile_hours,
    SUM(hbm_gb_hours) AS hbm_gb_hours,
    SUM(cost) AS cost,
    SUM(od_cost - cost) AS gross_savings,
    -- the on-demand price of the priced GPU-hours only, as gross_savings has it
    SUM(CASE WHEN cost IS NOT NULL THEN od_cost END) AS od_cost,
    SUM(unpriced_gpu_hours) AS unpriced_gpu_hours
  FROM alloc_priced
  GROUP BY grp, purchase_option
),
-- Paid GPU capacity nobody held, per instance-hour of an instance the meter saw: the bill's
-- GPU-hours minus those the meter attributed, at the hour's rate. Committed capacity
-- (PricingCategory Committed, or a reserved or capacity-block node) is 'reserved-idle'; the
-- rest (idle GPUs of a partly held on-demand or spot instance, or its hour with nothing held)
-- is 'unallocated'. Groups of their own, never spread over tenants, so that the groups add up
-- to the bill's GPU compute of these instances.
held AS (
  SELECT i.iid, a.hour_start, SUM(a.gpu_hours + a.mig_gpu_hours) AS gpu_hours
  FROM alloc a
  JOIN instances i ON i.resource_id = a.resource_id
  GROUP BY i.iid, a.hour_start
),
idle_hours AS (
  SELECT
    s.iid,
    s.hour_start,
    s.pricing_rank,
    s.gpu_hours - COALESCE(h.gpu_hours, 0) AS gpu_hours,
    (s.gpu_hours - COALESCE(h.gpu_hours, 0)) * s.rate AS cost
  FROM seen_hours s
  LEFT JOIN held h ON h.iid = s.iid AND h.hour_start = s.hour_start
  WHERE s.gpu_hours > COALESCE(h.gpu_hours, 0)
),
-- the idle instance-hours named and grouped (after the join: only these need the instance's
-- id and purchase option)
idle AS (
  SELECT
    CASE WHEN d.purchase_option IN ('reserved', 'capacity_block') THEN 'reserved-idle'
      ELSE 'unallocated' END AS kind,
    d.resource_id,
    d.hour_start,
    d.purchase_option,
    d.gpu_hours,
    d.cost
  FROM (
    SELECT
      i.resource_id,
      h.hour_start,
      CASE
        WHEN i.purchase_option = 'capacity_block' THEN 'capacity_block'
        WHEN h.pricing_rank = 3 OR i.purchase_option = 'reserved' THEN 'reserved'
        ELSE i.purchase_option
      END AS purchase_option,
      h.gpu_hours,
      h.cost
    FROM idle_hours h
    JOIN instances i ON i.iid = h.iid
  ) d
),
-- Restart waste and restart overhead parts as one relation, placed and priced once: both
-- are small (one row per gang, notice and instance), so the union costs the allocation
-- nothing; kind tells them apart.
restart_parts AS (
  SELECT 'waste' AS kind, grp, purchase_option, sku, hour_start, node, resource_id, gpu_seconds
  FROM waste
  UNION ALL
  SELECT 'overhead' AS kind, grp, purchase_option, sku, hour_start, node, resource_id,
    gpu_seconds
  FROM overhead
),
restart_hours AS (
  SELECT DISTINCT node, hour_start FROM restart_parts
),
node_instance AS (
  SELECT a.node, a.hour_start, MAX(a.resource_id) AS resource_id
  FROM alloc a
  JOIN restart_hours w ON w.node = a.node AND w.hour_start = a.hour_start
  WHERE a.resource_id IS NOT NULL
  GROUP BY a.node, a.hour_start
),
restart_placed AS (
  SELECT
    w.kind,
    w.grp,
    w.purchase_option,
    w.sku,
    w.hour_start,
    w.gpu_seconds,
    -- the meter's id of the node's instance (a GCE part names the instance, not its project)
    CASE
      WHEN n.resource_id IS NOT NULL
        AND (w.resource_id IS NULL OR n.resource_id = w.resource_id
             OR n.resource_id LIKE '%/' || w.resource_id)
        THEN n.resource_id
      ELSE w.resource_id
    END AS resource_id
  FROM restart_parts w
  LEFT JOIN node_instance n ON n.node = w.node AND n.hour_start = w.hour_start
),
restart_priced AS (
  SELECT
    w.kind,
    w.grp,
    w.purchase_option,
    w.gpu_seconds / 3600.0 AS gpu_hours,
    w.gpu_seconds / 3600.0 * COALESCE(br.rate, ir.rate, r.usd_per_gpu_hour) AS cost,
    -- the on-demand price of these GPU-hours, as the allocation's od_cost takes it: what
    -- restart overhead on spot costs the spot saving (docs/ledger.md, "Does spot pay?")
    w.gpu_seconds / 3600.0 * COALESCE(odf.rate, odb.rate, br.list_rate, br.rate, ir.rate,
      r.usd_per_gpu_hour) AS od_cost,
    CASE WHEN COALESCE(br.rate, ir.rate, r.usd_per_gpu_hour) IS NULL
      THEN w.gpu_seconds / 3600.0 ELSE 0 END AS unpriced_gpu_hours
  FROM bill_rate br
  RIGHT JOIN restart_placed w ON br.resource_id = w.resource_id AND br.hour_start = w.hour_start
  LEFT JOIN instance_rate ir ON ir.resource_id = w.resource_id
  LEFT JOIN rates r ON r.sku = w.sku AND r.purchase_option = w.purchase_option
  LEFT JOIN od_file odf ON odf.sku = w.sku
  LEFT JOIN od_bill odb ON odb.sku = w.sku
),
gang_outcome AS (
  SELECT DISTINCT event_id, grp, outcome, deadline_met FROM waste
),
parts AS (
  SELECT
    grp,
    SUM(gpu_hours) AS allocated_gpu_hours,
    SUM(CASE WHEN purchase_option = 'spot' THEN gpu_hours ELSE 0 END) AS gpu_hours_spot,
    SUM(CASE WHEN purchase_option = 'on_demand' THEN gpu_hours ELSE 0 END) AS gpu_hours_on_demand,
    SUM(CASE WHEN purchase_option = 'reserved' THEN gpu_hours ELSE 0 END) AS gpu_hours_reserved,
    SUM(CASE WHEN purchase_option = 'capacity_block' THEN gpu_hours ELSE 0 END)
      AS gpu_hours_capacity_block,
    SUM(mig_profile_hours) AS mig_profile_hours,
    SUM(hbm_gb_hours) AS hbm_gb_hours,
    SUM(cost) AS allocated_cost,
    SUM(CASE WHEN purchase_option = 'spot' THEN cost ELSE 0 END) AS cost_spot,
    SUM(CASE WHEN purchase_option = 'on_demand' THEN cost ELSE 0 END) AS cost_on_demand,
    SUM(CASE WHEN purchase_option = 'reserved' THEN cost ELSE 0 END) AS cost_reserved,
    SUM(CASE WHEN purchase_option = 'capacity_block' THEN cost ELSE 0 END) AS cost_capacity_block,
    0 AS reserved_idle_gpu_hours,
    0 AS reserved_idle_cost,
    0 AS unallocated_gpu_hours,
    0 AS unallocated_cost,
    SUM(CASE WHEN purchase_option = 'spot' THEN gross_savings ELSE 0 END) AS spot_gross_savings,
    SUM(CASE WHEN purchase_option = 'spot' THEN od_cost ELSE 0 END) AS spot_on_demand_cost,
    0 AS restart_waste_gpu_hours,
    0 AS restart_waste_cost,
    0 AS restart_overhead_gpu_hours,
    0 AS restart_overhead_cost,
    0 AS spot_waste_cost,
    0 AS spot_waste_gpu_hours,
    0 AS spot_overhead_gpu_hours,
    0 AS spot_overhead_cost,
    0 AS notices,
    0 AS gangs_hit,
    0 AS checkpointed,
    0 AS partial,
    0 AS not_durable,
    0 AS no_ack,
    0 AS not_opted_in,
    0 AS deadline_misses,
    SUM(unpriced_gpu_hours) AS unpriced_gpu_hours
  FROM alloc_by_option
  GROUP BY grp
  UNION ALL
  SELECT
    kind,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    SUM(CASE WHEN kind = 'reserved-idle' THEN gpu_hours ELSE 0 END),
    SUM(CASE WHEN kind = 'reserved-idle' THEN cost ELSE 0 END),
    SUM(CASE WHEN kind = 'unallocated' THEN gpu_hours ELSE 0 END),
    SUM(CASE WHEN kind = 'unallocated' THEN cost ELSE 0 END),
    0, 0,
    0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0,
    0
  FROM idle
  GROUP BY kind
  UNION ALL
  SELECT
    grp,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0,
    0, 0,
    SUM(CASE WHEN kind = 'waste' THEN gpu_hours ELSE 0 END),
    SUM(CASE WHEN kind = 'waste' THEN cost ELSE 0 END),
    SUM(CASE WHEN kind = 'overhead' THEN gpu_hours ELSE 0 END),
    SUM(CASE WHEN kind = 'overhead' THEN cost ELSE 0 END),
    SUM(CASE WHEN kind = 'waste' AND purchase_option = 'spot' THEN cost ELSE 0 END),
    SUM(CASE WHEN kind = 'waste' AND purchase_option = 'spot' THEN gpu_hours ELSE 0 END),
    SUM(CASE WHEN kind = 'overhead' AND purchase_option = 'spot' THEN gpu_hours ELSE 0 END),
    SUM(CASE WHEN kind = 'overhead' AND purchase_option = 'spot' AND cost IS NOT NULL
      THEN od_cost ELSE 0 END),
    0,
    0,
    0, 0, 0, 0, 0, 0,
    SUM(CASE WHEN kind = 'waste' THEN unpriced_gpu_hours ELSE 0 END)
  FROM restart_priced
  GROUP BY grp
  UNION ALL
  SELECT
    grp,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0,
    0, 0,
    0, 0, 0, 0, 0, 0, 0, 0,
    0, 0,
    SUM(CASE WHEN outcome = 'checkpointed' THEN 1 ELSE 0 END),
    SUM(CASE WHEN outcome = 'partial' THEN 1 ELSE 0 END),
    SUM(CASE WHEN outcome = 'not_durable' THEN 1 ELSE 0 END),
    SUM(CASE WHEN outcome = 'no_ack' THEN 1 ELSE 0 END),
    SUM(CASE WHEN outcome = 'not_opted_in' THEN 1 ELSE 0 END),
    SUM(CASE WHEN deadline_met THEN 0 ELSE 1 END),
    0
  FROM gang_outcome
  GROUP BY grp
  -- notices and gangs_hit: the restart-waste events' distinct ids, counted from waste itself
  -- (a COUNT(DISTINCT) beside restart_priced's sums has DuckDB split that aggregate in three
  -- and fan the priced parts out to each)
  UNION ALL
  SELECT
    grp,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0,
    0, 0,
    0, 0, 0, 0, 0, 0, 0, 0,
    COUNT(*),
    0,
    0, 0, 0, 0, 0, 0,
    0
  FROM (SELECT DISTINCT grp, notice_id FROM waste WHERE notice_id IS NOT NULL) n
  GROUP BY grp
  UNION ALL
  SELECT
    grp,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0,
    0, 0,
    0, 0, 0, 0, 0, 0, 0, 0,
    0,
    COUNT(*),
    0, 0, 0, 0, 0, 0,
    0
  FROM (SELECT DISTINCT grp, gang_id FROM waste WHERE gang_id IS NOT NULL) g
  GROUP BY grp
),
grouped AS (
  SELECT
    grp,
    SUM(allocated_gpu_hours) AS allocated_gpu_hours,
    SUM(gpu_hours_spot) AS gpu_hours_spot,
    SUM(gpu_hours_on_demand) AS gpu_hours_on_demand,
    SUM(gpu_hours_reserved) AS gpu_hours_reserved,
    SUM(gpu_hours_capacity_block) AS gpu_hours_capacity_block,
    SUM(mig_profile_hours) AS mig_profile_hours,
    SUM(hbm_gb_hours) AS hbm_gb_hours,
    SUM(allocated_cost) AS allocated_cost,
    SUM(cost_spot) AS cost_spot,
    SUM(cost_on_demand) AS cost_on_demand,
    SUM(cost_reserved) AS cost_reserved,
    SUM(cost_capacity_block) AS cost_capacity_block,
    SUM(reserved_idle_gpu_hours) AS reserved_idle_gpu_hours,
    SUM(reserved_idle_cost) AS reserved_idle_cost,
    SUM(unallocated_gpu_hours) AS unallocated_gpu_hours,
    SUM(unallocated_cost) AS unallocated_cost,
    SUM(restart_waste_gpu_hours) AS restart_waste_gpu_hours,
    SUM(restart_waste_cost) AS restart_waste_cost,
    SUM(restart_overhead_gpu_hours) AS restart_overhead_gpu_hours,
    SUM(restart_overhead_cost) AS restart_overhead_cost,
    SUM(notices) AS notices,
    SUM(gangs_hit) AS gangs_hit,
    SUM(checkpointed) AS checkpointed,
    SUM(partial) AS partial,
    SUM(not_durable) AS not_durable,
    SUM(no_ack) AS no_ack,
    SUM(not_opted_in) AS not_opted_in,
    SUM(deadline_misses) AS deadline_misses,
    -- not restart_overhead_cost: it is part of allocated_cost already (the header)
    SUM(allocated_cost) + SUM(reserved_idle_cost) + SUM(unallocated_cost)
      + SUM(restart_waste_cost) AS effective_cost,
    SUM(restart_waste_gpu_hours) / NULLIF(SUM(allocated_gpu_hours), 0) AS waste_share,
    SUM(spot_on_demand_cost) AS spot_on_demand_cost,
    SUM(spot_waste_gpu_hours) AS spot_waste_gpu_hours,
    SUM(spot_waste_cost) AS spot_waste_cost,
    SUM(spot_overhead_gpu_hours) AS spot_overhead_gpu_hours,
    SUM(spot_overhead_cost) AS spot_overhead_cost,
    -- does spot pay (docs/ledger.md): the on-demand price of the spot GPU-hours less their
    -- cost, the waste on spot at the rate it was lost at (to be computed again) and the
    -- restart overhead on spot at the on-demand rate (its spot cost is in cost_spot already;
    -- an on-demand run would not have held those GPU-hours)
    SUM(spot_gross_savings) - SUM(spot_waste_cost) - SUM(spot_overhead_cost)
      AS spot_net_savings,
    SUM(unpriced_gpu_hours) AS unpriced_gpu_hours
  FROM parts
  GROUP BY grp
)
-- the result: one row per group (idle.sql puts its own SELECT here: one row per idle
-- instance-hour, over the relations above)
SELECT
  grp,
  allocated_gpu_hours,
  gpu_hours_spot,
  gpu_hours_on_demand,
  gpu_hours_reserved,
  gpu_hours_capacity_block,
  mig_profile_hours,
  hbm_gb_hours,
  allocated_cost,
  cost_spot,
  cost_on_demand,
  cost_reserved,
  cost_capacity_block,
  reserved_idle_gpu_hours,
  reserved_idle_cost,
  unallocated_gpu_hours,
  unallocated_cost,
  restart_waste_gpu_hours,
  restart_waste_cost,
  restart_overhead_gpu_hours,
  restart_overhead_cost,
  notices,
  gangs_hit,
  checkpointed,
  partial,
  not_durable,
  no_ack,
  not_opted_in,
  deadline_misses,
  effective_cost,
  effective_cost / NULLIF(SUM(effective_cost) OVER (), 0) AS cost_share,
  waste_share,
  spot_on_demand_cost,
  spot_waste_gpu_hours,
  spot_waste_cost,
  spot_overhead_gpu_hours,
  spot_overhead_cost,
  spot_net_savings,
  unpriced_gpu_hours
FROM grouped
ORDER BY grp
