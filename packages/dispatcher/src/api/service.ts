import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import type { ApiEndpoint } from "@boxcar/protocol";
import { apiEndpointMetadata } from "@boxcar/protocol/internal";
import { type Service, Svcm } from "@nats-io/services";
import type { AdmissionContext } from "../intake/admission.js";
import { type ApiParts, apiHandlers, serve } from "./api.js";

/** What the dispatchers' NATS service says of itself in `$SRV.INFO`. */
export interface ServiceInfo {
  dispatcherId: string;
  version: string;
}

/**
 * The request/reply API as a NATS service (`$SRV.PING` finds it): each endpoint on
 * `<prefix>.api.*.*.<endpoint>`, in the service's queue group, so each request goes to one
 * dispatcher.
 */
export class ApiService {
  private service: Service | undefined;

  constructor(
    private readonly topology: Topology,
    private readonly ctx: AdmissionContext,
    private readonly parts: ApiParts,
    private readonly info: ServiceInfo,
  ) {}

  /** Registers the service and its endpoints. */
  async start(): Promise<void> {
    const { topology, ctx, info } = this;
    const log: Logger = ctx.log;
    const service = await new Svcm(topology.nc).add({
      name: topology.names.serviceName,
      version: info.version,
      description: "Boxcar dispatcher: admits jobs and answers the job, agent and worker API",
      metadata: { dispatcherId: info.dispatcherId, prefix: topology.names.prefix },
    });
    this.service = service;
    for (const [endpoint, handler] of Object.entries(apiHandlers(topology, ctx, this.parts))) {
      service.addEndpoint(endpoint.replaceAll(".", "-"), {
        subject: topology.names.subjects.apiEndpoint(endpoint as ApiEndpoint),
        metadata: apiEndpointMetadata(endpoint as ApiEndpoint),
        handler: (err, msg) => {
          if (err) {
            log.error({ err }, "service endpoint failed");
            return;
          }
          void serve(topology, endpoint as ApiEndpoint, handler, msg, log);
        },
      });
    }
  }

  /** Stops answering. */
  async stop(): Promise<void> {
    await this.service?.stop();
  }
}
