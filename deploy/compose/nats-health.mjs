// The health check of a NATS server of the Compose cluster (deploy/compose), run in its
// container every 5 s: healthy once JetStream is current (/healthz) and the cluster's JetStream
// group has all three servers and a leader (/jsz), so a stream of 3 replicas can be placed.
//
// It also mends the one way nats-server 2.10 was seen to start wrong here (in CI twice, and here
// with TLS on routes): when a server's routes come up late, the group's first leader can count
// it as a server without JetStream and settle for a group of 2. The server left out then stays
// out, every server answers /healthz, and every stream of 3 replicas is refused with "no suitable
// peers for placement". A server that finds itself outside the leader's group for 20 s stops
// (SIGTERM to the server, whose pid it wrote to /tmp/nats-server.pid); the loop it runs under
// (nats-run.sh) starts it again, the container staying up, and on its return the leader adds it
// (seen: a group of 3 within 8 s).
import { readFile, rm, writeFile } from "node:fs/promises";

const SELF = process.env.SERVER_NAME;
const SERVERS = 3;
const LEFT_OUT_GRACE_MS = 20_000;
const MARK = "/tmp/boxcar-left-out-since";
const PID_FILE = "/tmp/nats-server.pid";

const get = async (url) => {
  const res = await fetch(url, { signal: AbortSignal.timeout(2_000) });
  if (!res.ok) throw new Error(`${url}: ${res.status}`);
  return res.json();
};

try {
  await get("https://127.0.0.1:8222/healthz");
  const meta = (await get("https://127.0.0.1:8222/jsz")).meta_cluster ?? {};
  if (meta.leader && meta.cluster_size >= SERVERS) {
    await rm(MARK, { force: true });
    process.exit(0);
  }
  if (meta.leader && meta.leader !== SELF) {
    const group = (await get(`https://${meta.leader}:8222/jsz`)).meta_cluster ?? {};
    const members = [group.leader, ...(group.replicas ?? []).map((r) => r.name)];
    if (group.leader === meta.leader && !members.includes(SELF)) {
      const since = Number(await readFile(MARK, "utf8").catch(() => "")) || Date.now();
      await writeFile(MARK, String(since));
      if (Date.now() - since > LEFT_OUT_GRACE_MS) {
        await rm(MARK, { force: true });
        process.stdout.write(`${SELF} is outside the JetStream group of ${members.join(", ")}: restarting\n`);
        process.kill(Number(await readFile(PID_FILE, "utf8")), "SIGTERM");
      }
    }
  }
} catch (err) {
  process.stdout.write(`${err}\n`);
}
process.exit(1);
