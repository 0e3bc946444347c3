import type Docker from "dockerode";
import { expect, test } from "vitest";
import { sharesFolder } from "./workspace-mounting.js";

type Mount = Docker.ContainerInspectInfo["Mounts"][number];
const mounts = (...list: Pick<Mount, "Type" | "Source" | "Destination">[]) => ({ Mounts: list as Mount[] });

test("a worker in a container shares a folder with the engine's machine only through a bind mount at the same path", () => {
  const same = mounts({ Type: "bind", Source: "/srv/boxcar", Destination: "/srv/boxcar" });
  expect(sharesFolder(same, "/srv/boxcar")).toBe(true);
  expect(sharesFolder(same, "/srv/boxcar/work")).toBe(true);
  expect(sharesFolder(same, "/srv/boxcar-other")).toBe(false); // a prefix of the name is not a parent
  expect(sharesFolder(same, "/dev/shm")).toBe(false);
  expect(sharesFolder(mounts({ Type: "bind", Source: "/host/work", Destination: "/srv/boxcar" }), "/srv/boxcar")).toBe(false);
  expect(sharesFolder(mounts({ Type: "volume", Source: "/srv/boxcar", Destination: "/srv/boxcar" }), "/srv/boxcar")).toBe(false);
  expect(sharesFolder(mounts(), "/srv/boxcar")).toBe(false);
  // The innermost mount holding the folder decides: a shared parent does not make a mounted child shared.
  const nested = mounts(
    { Type: "bind", Source: "/srv", Destination: "/srv" },
    { Type: "bind", Source: "/elsewhere", Destination: "/srv/boxcar/work" },
  );
  expect(sharesFolder(nested, "/srv/boxcar/work/jobs")).toBe(false);
  expect(sharesFolder(nested, "/srv/other")).toBe(true);
  expect(sharesFolder(mounts({ Type: "bind", Source: "/srv/boxcar/", Destination: "/srv/boxcar" }), "/srv/boxcar/x")).toBe(true);
});
