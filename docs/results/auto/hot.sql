SELECT count(*), sum(length(b)) FROM t;
WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i < QUERIES)
SELECT count(*), sum((SELECT instr(b, x'00') FROM t WHERE id = 1 + (c.i * 7919) % (ROWS / 10))) FROM c;
