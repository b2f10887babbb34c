// Portkey's gateway listens on every interface and has no setting to change that. Loaded before it
// (node --import ./portkey-loopback.mjs node_modules/@portkey-ai/gateway/build/start-server.js), this makes a
// listen() given a port and no host listen on 127.0.0.1 only; put a reverse proxy in front to serve others.
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" && typeof args[1] !== "string") args.splice(1, 0, "127.0.0.1");
  return listen.apply(this, args);
};
