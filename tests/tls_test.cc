// Mutual TLS and roles through the real daemons (issue 14): a cluster trains with every channel
// on mTLS, and calls without a certificate, with another CA's, an expired one, another
// cluster's, or a role that may not make them are refused, change nothing, and leave the
// daemons serving. Certificates come from deploy/tls/make_certs.sh (openssl).
#include "security/tls.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "client/grpc_channel.h"
#include "common/status_macros.h"
#include "common/tensor_wire.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "openssl/ssl.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "proto/ps_service.grpc.pb.h"
#include "security/wire_tls.h"
#include "testing/child_process.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

std::string TmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Runs a command under /bin/sh to completion.
ShellResult RunShell(const std::string& command) {
  static int n = 0;
  return RunShellCommand(command, absl::StrCat(TmpDir(), "/run", n++, ".log"));
}

// make_certs.sh with these arguments; CHECK-fails (the test cannot go on) if it fails.
void MakeCerts(const std::string& args) {
  ShellResult r = RunShell(
      absl::StrCat("exec bash ", Quote(RunfilePath("deploy/tls/make_certs.sh")), " ", args));
  CHECK_EQ(r.exit_code, 0) << r.output;
}

class TlsClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Writes to a data port that closed the connection (a refused handshake) must fail, not
    // end the test with SIGPIPE (OpenSSL writes with write(2)).
    signal(SIGPIPE, SIG_IGN);
    dir_ = new std::string(TmpDir() + "/certs");
    const std::string hosts =
        "--chief_hosts 127.0.0.1:0 --ps_hosts 127.0.0.1:0 --worker_hosts 127.0.0.1:0";
    MakeCerts(absl::StrCat("--out ", *dir_, "/main --cluster mnist ", hosts));
    // Another CA, same names.
    MakeCerts(absl::StrCat("--out ", *dir_, "/other_ca --cluster mnist ", hosts));
    // The cluster's own CA, but expired (valid until a day ago).
    MakeCerts(absl::StrCat("--out ", *dir_, "/expired --ca_dir ", *dir_,
                           "/main --cluster mnist --days -1 ", hosts));
    // The cluster's own CA, another cluster's name.
    MakeCerts(
        absl::StrCat("--out ", *dir_, "/foreign --ca_dir ", *dir_, "/main --cluster ads ", hosts));
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    TestClusterOptions options = EndlessSyncTraining(/*num_ps=*/1, /*num_workers=*/1);
    options.tls_dir = *dir_ + "/main";
    static int clusters = 0;
    checkpoint_dir_ = absl::StrCat(TmpDir(), "/checkpoints-", clusters++);
    options.flags["chief"].push_back("--checkpoint_dir=" + checkpoint_dir_);
    options.flags["ps"].push_back("--checkpoint_dir=" + checkpoint_dir_);
    auto cluster = TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    chief_ = ChiefStubOf(*cluster_);
    // Every test starts from a cluster that trains: a save or `psctl vars` needs the model
    // ready, which on a loaded machine it may not be yet when Start returns.
    ASSERT_TRUE(AwaitGlobalStep(*chief_, 1, absl::Seconds(30))) << cluster_->Logs();
  }

  static TlsConfig Files(const std::string& set, const std::string& holder) {
    TlsConfig tls = TlsFilesOf(*dir_ + "/" + set, holder);
    tls.ca_file = *dir_ + "/main/ca.pem";  // every client trusts the cluster's real CA
    return tls;
  }

  std::unique_ptr<v1::ParameterServer::Stub> PsStub(const TlsConfig& tls) {
    GrpcChannelOptions channel;
    channel.tls = tls;
    return v1::ParameterServer::NewStub(NewGrpcChannel(cluster_->address("ps:0"), channel));
  }

  std::unique_ptr<v1::Coordinator::Stub> ChiefStub(const TlsConfig& tls) {
    GrpcChannelOptions channel;
    channel.tls = tls;
    return v1::Coordinator::NewStub(NewGrpcChannel(cluster_->chief_address(), channel));
  }

  static void Deadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  // ps:0's shards (names and shapes) as the chief's certificate reads them.
  std::vector<std::string> Shards() {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::ListShardsResponse shards;
    grpc::Status s = PsStub(Files("main", "chief-0"))->ListShards(&ctx, {}, &shards);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<std::string> out;
    for (const v1::ShardStats& shard : shards.shards()) {
      out.push_back(shard.name() + " " + shard.shape().ShortDebugString());
    }
    return out;
  }

  // Training goes on over mTLS: the global step moves past where it is now.
  void ExpectTraining() {
    const int64_t now = ClusterStatusOf(*chief_).global_step();
    EXPECT_TRUE(AwaitGlobalStep(*chief_, now + 5, absl::Seconds(30))) << cluster_->Logs();
  }

  // ps:0's data port, as GetStatus reports it.
  int DataPort() {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::TaskStatus status;
    grpc::Status s = PsStub(Files("main", "worker-0"))->GetStatus(&ctx, {}, &status);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return status.data_port();
  }

  // A connection to ps:0's data port over TLS with `tls` (without a certificate when only
  // ca_file is set: a raw OpenSSL client, since a cluster member always has one).
  static absl::StatusOr<std::unique_ptr<WireSocket>> DataPlaneSocket(int port,
                                                                     const TlsConfig& tls) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<WireSocket> socket,
                        WireSocket::Connect("127.0.0.1", port, absl::Seconds(5), 0));
    if (tls.cert_file.empty()) {
      SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
      SSL_CTX_load_verify_locations(ctx, tls.ca_file.c_str(), nullptr);
      SSL* ssl = SSL_new(ctx);
      SSL_CTX_free(ctx);  // the SSL keeps its own reference
      SSL_set_fd(ssl, socket->fd());
      if (SSL_connect(ssl) != 1) {
        SSL_free(ssl);
        return absl::UnauthenticatedError("the handshake without a certificate failed");
      }
      // TLS 1.3: the client finishes before the server has checked it; the admission (never
      // sent to it) is where the refusal shows.
      char admission[8];
      const int got = SSL_read(ssl, admission, sizeof(admission));
      SSL_free(ssl);
      if (got <= 0)
        return absl::UnauthenticatedError("the ps refused the client with no certificate");
      return absl::InternalError("the ps admitted a client with no certificate");
    }
    PS_ASSIGN_OR_RETURN(std::shared_ptr<WireTlsContext> context,
                        WireTlsContext::Create(tls, WireTlsContext::Side::kClient));
    PS_ASSIGN_OR_RETURN(SslPtr ssl,
                        context->Handshake(socket->fd(), "127.0.0.1", absl::Seconds(5)));
    PS_ASSIGN_OR_RETURN(bool sealed, context->AwaitAdmission(ssl.get(), absl::Seconds(5)));
    PS_RETURN_IF_ERROR(socket->AttachTls(ssl.release(), sealed));
    return socket;
  }

  // One request on the data plane; the answer's status (an I/O error when the ps closed).
  static absl::Status Exchange(WireSocket& socket, WireOp op, const std::string& meta,
                               const std::string& payload) {
    FrameHeader h;
    h.op = static_cast<uint16_t>(op);
    h.meta_bytes = static_cast<uint32_t>(meta.size());
    h.payload_bytes = payload.size();
    char raw[kFrameHeaderBytes];
    EncodeFrameHeader(h, raw);
    PS_RETURN_IF_ERROR(
        socket.Write(std::string(raw, sizeof(raw)) + meta + payload, absl::Seconds(10)));
    PS_RETURN_IF_ERROR(socket.ReadExact(raw, kFrameHeaderBytes, absl::Seconds(10)));
    PS_ASSIGN_OR_RETURN(FrameHeader answer, DecodeFrameHeader(raw));
    std::string answer_meta(answer.meta_bytes, '\0');
    PS_RETURN_IF_ERROR(socket.ReadExact(answer_meta.data(), answer_meta.size(), absl::Seconds(10)));
    std::string answer_payload(answer.payload_bytes, '\0');
    PS_RETURN_IF_ERROR(
        socket.ReadExact(answer_payload.data(), answer_payload.size(), absl::Seconds(10)));
    return WireErrorStatus(answer.status, answer_meta);
  }

  ShellResult Psctl(const std::string& holder, const std::string& command) {
    const TlsConfig tls = TlsFilesOf(*dir_ + "/main", holder);
    return RunShell(absl::StrCat("exec ", Quote(RunfilePath("cli/psctl")), " ", command,
                                 " --chief=", cluster_->chief_address(),
                                 " --tls_ca_file=", tls.ca_file, " --tls_cert_file=", tls.cert_file,
                                 " --tls_key_file=", tls.key_file));
  }

  static std::string* dir_;
  std::string checkpoint_dir_;  // the chief's and ps:0's
  std::unique_ptr<TestCluster> cluster_;
  std::unique_ptr<v1::Coordinator::Stub> chief_;
};

std::string* TlsClusterTest::dir_ = nullptr;

TEST_F(TlsClusterTest, TrainsWithEveryChannelOnMutualTls) {
  ExpectTraining();
  // The tensor data plane is served with mutual TLS too, and the worker trains through it.
  EXPECT_GT(DataPort(), 0);
  EXPECT_THAT(cluster_->ps(0).LogTail(200), HasSubstr("tensor data plane on port "));
  EXPECT_THAT(cluster_->ps(0).LogTail(200), HasSubstr(" (mutual TLS)"));
}

// The data port answers only peers with a certificate of this cluster, and checks each request
// against the caller's role as gRPC does (issue 32): plaintext, no certificate, another CA's,
// an expired one and another cluster's are refused before any request is read; psctl's viewer
// may pull but not push; a worker may not push as another worker. Nothing changes, and the
// cluster trains on.
TEST_F(TlsClusterTest, TheDataPortRefusesCallersAndCallsOutsideTheirRole) {
  const std::vector<std::string> before = Shards();
  const int port = DataPort();
  ASSERT_GT(port, 0);
  // The first dense partition of ps:0, and a push of zeros to it as the given worker.
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::ListShardsResponse listed;
  ASSERT_TRUE(PsStub(Files("main", "chief-0"))->ListShards(&ctx, {}, &listed).ok());
  v1::ShardStats shard;
  for (const v1::ShardStats& s : listed.shards()) {
    if (!s.is_table()) shard = s;
  }
  ASSERT_FALSE(shard.name().empty());
  int64_t elements = 1;
  for (int64_t d : shard.shape().dims()) elements *= d;
  auto push = [&](WireSocket& socket, int worker) {
    v1::PushDenseHeader header;
    v1::ShardRef* ref = header.add_shards();
    ref->set_variable(shard.name());
    ref->set_partition(shard.partition());
    header.add_num_elements(elements);
    header.set_worker(worker);
    header.set_step(ClusterStatusOf(*chief_).global_step());
    return Exchange(socket, WireOp::kPushDense, header.SerializeAsString(),
                    std::string(elements * sizeof(float), '\0'));
  };
  auto pull = [&](WireSocket& socket) {
    v1::PullDenseRequest req;
    v1::ShardRef* ref = req.add_shards();
    ref->set_variable(shard.name());
    ref->set_partition(shard.partition());
    return Exchange(socket, WireOp::kPullDense, req.SerializeAsString(), "");
  };

  // Plaintext: the ps reads a frame where it expects a TLS ClientHello and closes.
  {
    auto socket = WireSocket::Connect("127.0.0.1", port, absl::Seconds(5), 0);
    ASSERT_TRUE(socket.ok()) << socket.status();
    absl::Status s = pull(**socket);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  }
  // TLS without a certificate, with another CA's, an expired one, another cluster's.
  struct Case {
    const char* what;
    TlsConfig tls;
  };
  TlsConfig no_certificate;
  no_certificate.ca_file = *dir_ + "/main/ca.pem";
  const Case refused[] = {
      {"no certificate", no_certificate},
      {"another CA's certificate", Files("other_ca", "worker-0")},
      {"an expired certificate", Files("expired", "worker-0")},
      {"another cluster's certificate", Files("foreign", "worker-0")},
  };
  for (const Case& c : refused) {
    auto socket = DataPlaneSocket(port, c.tls);
    absl::Status s = socket.ok() ? push(**socket, 0) : socket.status();
    EXPECT_FALSE(s.ok()) << c.what;
    EXPECT_NE(s.code(), absl::StatusCode::kDeadlineExceeded) << c.what << ": " << s;
  }
  // psctl's viewer reads, and may not push.
  {
    auto socket = DataPlaneSocket(port, Files("main", "psctl-viewer"));
    ASSERT_TRUE(socket.ok()) << socket.status();
    EXPECT_TRUE(pull(**socket).ok());
    absl::Status s = push(**socket, 0);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("role viewer (psctl viewer) may not call ParameterServer.PushDense"));
  }
  // A worker pushes only as itself.
  {
    auto socket = DataPlaneSocket(port, Files("main", "worker-0"));
    ASSERT_TRUE(socket.ok()) << socket.status();
    absl::Status s = push(**socket, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("worker:0 may not call ParameterServer.PushDense for worker:1"));
  }
  // Replication's forwards (issue 37) are for ps tasks, each for its own shards: a worker's
  // key and a ps task's key speaking for another are refused here as over gRPC, whole (op 5)
  // or streamed while the push arrives (op 6).
  for (const WireOp op : {WireOp::kReplicate, WireOp::kReplicateStream}) {
    for (const auto& [holder, message] : std::vector<std::pair<std::string, std::string>>{
             {"worker-0", "role worker (worker:0) may not call ParameterServer.Replicate"},
             {"ps-0", "ps:0 may not call ParameterServer.Replicate for ps:1"}}) {
      auto socket = DataPlaneSocket(port, Files("main", holder));
      ASSERT_TRUE(socket.ok()) << socket.status();
      v1::ReplicateHeader header;
      header.set_primary_ps_task(1);
      if (holder == "worker-0") header.set_primary_ps_task(0);
      header.mutable_push()->add_shards()->set_variable("layer/kernel");
      header.mutable_push()->add_num_elements(1);
      if (op == WireOp::kReplicate) header.add_versions(1);  // a stream's come with its commit
      const float one = 1;
      absl::Status s = Exchange(**socket, op, header.SerializeAsString(),
                                std::string(reinterpret_cast<const char*>(&one), sizeof(one)));
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied)
          << "op " << static_cast<int>(op) << ": " << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr(message)) << static_cast<int>(op);
    }
  }
  // A table push's forward (op 8) likewise.
  for (const auto& [holder, message] : std::vector<std::pair<std::string, std::string>>{
           {"worker-0", "role worker (worker:0) may not call ParameterServer.ReplicateSparse"},
           {"ps-0", "ps:0 may not call ParameterServer.ReplicateSparse for ps:1"}}) {
    auto socket = DataPlaneSocket(port, Files("main", holder));
    ASSERT_TRUE(socket.ok()) << socket.status();
    v1::ReplicateSparseRequest forward;
    forward.set_primary_ps_task(holder == "worker-0" ? 0 : 1);
    forward.set_table("emb");
    v1::SparseStripeGroup* g = forward.add_groups();
    g->set_stripe(0);
    g->set_sequence(1);
    g->set_count(1);
    const int64_t key = 7;
    std::string payload(reinterpret_cast<const char*>(&key), sizeof(key));
    payload.append(std::string(4 * sizeof(float), '\0'));
    absl::Status s =
        Exchange(**socket, WireOp::kReplicateSparse, forward.SerializeAsString(), payload);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message));
  }
  // A commit (op 7) with no stream before it, even from a ps task's key, is refused.
  {
    auto socket = DataPlaneSocket(port, Files("main", "ps-0"));
    ASSERT_TRUE(socket.ok()) << socket.status();
    v1::ReplicateHeader versions;
    versions.add_versions(1);
    absl::Status s = Exchange(**socket, WireOp::kReplicateCommit, versions.SerializeAsString(), "");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("a ReplicateCommit without the ReplicateStream it commits"));
  }
  EXPECT_EQ(Shards(), before);
  // The ps serves on: training goes on, over the data plane.
  ExpectTraining();
}

TEST_F(TlsClusterTest, RefusesCallersWithoutAValidCertificate) {
  const std::vector<std::string> before = Shards();
  struct Case {
    const char* what;
    TlsConfig tls;
  };
  const Case cases[] = {
      {"no certificate (plaintext)", TlsConfig()},
      {"another CA's certificate", Files("other_ca", "worker-0")},
      {"an expired certificate", Files("expired", "worker-0")},
  };
  for (const Case& c : cases) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::CreateShardsRequest create;
    create.add_dense()->mutable_variable()->set_name("injected");
    v1::CreateShardsResponse created;
    grpc::Status s = PsStub(c.tls)->CreateShards(&ctx, create, &created);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << c.what << ": " << s.error_message();

    grpc::ClientContext ctx2;
    Deadline(&ctx2);
    v1::ReportStepRequest report;
    report.set_worker(0);
    report.set_finished(true);
    v1::ReportStepResponse reported;
    s = ChiefStub(c.tls)->ReportStep(&ctx2, report, &reported);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << c.what << ": " << s.error_message();
  }
  // A certificate from the cluster's own CA that names another cluster gets through the
  // handshake and is refused by name.
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::ListShardsResponse listed;
  grpc::Status s = PsStub(Files("foreign", "worker-0"))->ListShards(&ctx, {}, &listed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("spiffe://ads/worker/0"));
  EXPECT_THAT(s.error_message(), HasSubstr("not a member of cluster \"mnist\""));

  EXPECT_EQ(Shards(), before);
  ExpectTraining();
}

// Clients check the server's certificate too: ps:0's names 127.0.0.1, so a client that expects
// another name there (as if DNS had sent it to the wrong host) refuses it although the chain
// is good.
TEST_F(TlsClusterTest, ClientsVerifyTheServersHostName) {
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("ps-0.elsewhere.example");
  auto stub = v1::ParameterServer::NewStub(grpc::CreateCustomChannel(
      cluster_->address("ps:0"), ChannelCredentialsFor(Files("main", "worker-0")), args));
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::ListShardsResponse listed;
  grpc::Status s = stub->ListShards(&ctx, {}, &listed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // The same client, expecting the name the certificate has, is served.
  grpc::ChannelArguments right;
  right.SetSslTargetNameOverride("127.0.0.1");
  stub = v1::ParameterServer::NewStub(grpc::CreateCustomChannel(
      cluster_->address("ps:0"), ChannelCredentialsFor(Files("main", "worker-0")), right));
  grpc::ClientContext ctx2;
  Deadline(&ctx2);
  s = stub->ListShards(&ctx2, {}, &listed);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(TlsClusterTest, AWorkerMayNotCreateSaveOrSpeakForAnotherTask) {
  const std::vector<std::string> before = Shards();
  const int64_t step_before = ClusterStatusOf(*chief_).global_step();
  auto ps = PsStub(Files("main", "worker-0"));
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::CreateShardsRequest create;
    create.add_dense()->mutable_variable()->set_name("injected");
    v1::CreateShardsResponse created;
    grpc::Status s = ps->CreateShards(&ctx, create, &created);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(),
                HasSubstr("role worker (worker:0) may not call ParameterServer.CreateShards; "
                          "allowed: chief"));
  }
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::SaveShardsRequest save;
    save.set_checkpoint_path("/etc/evil");
    v1::SaveShardsResponse saved;
    grpc::Status s = ps->SaveShards(&ctx, save, &saved);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("may not call ParameterServer.SaveShards"));
  }
  {
    // The spoofed re-registration that rolled a whole model back (issue 14).
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::RegisterTaskRequest reg;
    reg.mutable_task()->set_job("ps");
    reg.mutable_task()->set_index(0);
    reg.set_address("127.0.0.1:1");
    reg.set_incarnation(987654321);
    v1::RegisterTaskResponse registered;
    grpc::Status s = ChiefStub(Files("main", "worker-0"))->RegisterTask(&ctx, reg, &registered);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(),
                HasSubstr("worker:0 may not call Coordinator.RegisterTask for ps:0"));
  }
  {
    // Pushes that name another worker (a stolen worker key filling another worker's share of
    // a sync step, issue 32): refused before the ps looks at them.
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::PushSparseRequest push;
    push.set_table("emb");
    push.set_worker(1);
    push.set_step(ClusterStatusOf(*chief_).global_step());
    v1::PushSparseResponse pushed;
    grpc::Status s = ps->PushSparse(&ctx, push, &pushed);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(),
                HasSubstr("worker:0 may not call ParameterServer.PushSparse for worker:1"));
    grpc::ClientContext dense_ctx;
    Deadline(&dense_ctx);
    v1::PushDenseResponse dense_pushed;
    auto writer = ps->PushDense(&dense_ctx, &dense_pushed);
    v1::PushDenseRequest header;
    header.mutable_header()->set_worker(1);
    header.mutable_header()->set_step(ClusterStatusOf(*chief_).global_step());
    writer->Write(header);
    writer->WritesDone();
    s = writer->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(),
                HasSubstr("worker:0 may not call ParameterServer.PushDense for worker:1"));
  }
  {
    // Replication's forwards (issue 37): for ps tasks only, each for its own shards. A
    // worker's key, and a ps task's key speaking for another ps task, are refused before the
    // stream is read further.
    struct Forger {
      std::string holder;
      int primary;
      std::string message;
    };
    for (const Forger& f : std::vector<Forger>{
             {"worker-0", 0, "role worker (worker:0) may not call ParameterServer.Replicate"},
             {"ps-0", 1, "ps:0 may not call ParameterServer.Replicate for ps:1"}}) {
      grpc::ClientContext ctx;
      Deadline(&ctx);
      v1::ReplicateResponse replicated;
      auto writer = PsStub(Files("main", f.holder))->Replicate(&ctx, &replicated);
      v1::ReplicateRequest header;
      header.mutable_header()->set_primary_ps_task(f.primary);
      header.mutable_header()->mutable_push()->add_shards()->set_variable("layer/kernel");
      header.mutable_header()->mutable_push()->add_num_elements(1);
      header.mutable_header()->add_versions(1);
      writer->Write(header);
      writer->WritesDone();
      grpc::Status s = writer->Finish();
      EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr(f.message));
      // A table's forwards alike.
      grpc::ClientContext sparse_ctx;
      Deadline(&sparse_ctx);
      v1::ReplicateSparseRequest rows;
      rows.set_primary_ps_task(f.primary);
      rows.set_table("emb");
      v1::ReplicateSparseResponse rows_replicated;
      s = PsStub(Files("main", f.holder))->ReplicateSparse(&sparse_ctx, rows, &rows_replicated);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
      EXPECT_THAT(s.error_message(),
                  HasSubstr(absl::StrReplaceAll(f.message, {{"Replicate", "ReplicateSparse"}})));
    }
  }
  {
    // ReportStep for a worker index that is not the caller's.
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::ReportStepRequest report;
    report.set_worker(0);
    report.set_finished(true);
    v1::ReportStepResponse reported;
    grpc::Status s = ChiefStub(Files("main", "ps-0"))->ReportStep(&ctx, report, &reported);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  }
  EXPECT_EQ(Shards(), before);  // no "injected" shard
  const v1::ClusterStatus status = ClusterStatusOf(*chief_);
  EXPECT_GE(status.global_step(), step_before);
  for (const v1::TaskStatus& task : status.tasks()) {
    EXPECT_NE(task.address(), "127.0.0.1:1") << "the spoofed registration was accepted";
  }
  ExpectTraining();
}

// Even the chief's certificate cannot make a ps write outside its own --checkpoint_dir, or into
// a committed checkpoint: requests name a checkpoint, not a path.
TEST_F(TlsClusterTest, CheckpointsStayInsideTheCheckpointDirectory) {
  ShellResult saved = Psctl("psctl-admin", "save");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  std::string committed;  // the last checkpoint listed
  std::istringstream names(RunShell("ls " + Quote(checkpoint_dir_)).output);
  for (std::string line; std::getline(names, line);) {
    if (absl::StartsWith(line, "ckpt-")) committed = line;
  }
  ASSERT_FALSE(committed.empty()) << "no checkpoint in " << checkpoint_dir_;
  auto ps = PsStub(Files("main", "chief-0"));
  struct Case {
    std::string name;
    grpc::StatusCode code;
    const char* message;
  };
  // A checkpoint directory whose ps-0 entry is a link out of the checkpoint directory, and one
  // whose ps-0 is a link that leads nowhere yet (issue 32: the save wrote RocksDB files
  // through the first, and the second gave UNAVAILABLE).
  const std::string outside = TmpDir() + "/outside";
  ASSERT_EQ(
      RunShell("mkdir -p " + Quote(outside) + " " + Quote(checkpoint_dir_ + "/ckpt-linked") + " " +
               Quote(checkpoint_dir_ + "/ckpt-dangling") + " && ln -sfn " + Quote(outside) + " " +
               Quote(checkpoint_dir_ + "/ckpt-linked/ps-0") + " && ln -sfn " +
               Quote(outside + "/not-yet") + " " + Quote(checkpoint_dir_ + "/ckpt-dangling/ps-0"))
          .exit_code,
      0);
  const Case cases[] = {
      {"../escaped", grpc::StatusCode::INVALID_ARGUMENT, "a path, not a name"},
      {"/etc/evil", grpc::StatusCode::INVALID_ARGUMENT, "a path, not a name"},
      {committed, grpc::StatusCode::FAILED_PRECONDITION, "never written into again"},
      {"ckpt-linked", grpc::StatusCode::INVALID_ARGUMENT, "/ckpt-linked/ps-0 is a symbolic link"},
      {"ckpt-dangling", grpc::StatusCode::INVALID_ARGUMENT,
       "/ckpt-dangling/ps-0 is a symbolic link"},
  };
  for (const Case& c : cases) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::SaveShardsRequest save;
    save.set_checkpoint(c.name);
    save.set_checkpoint_path("/tmp/escaped-by-path");
    save.set_ps_index(c.name.rfind("ckpt-", 0) == 0 && c.name != committed ? 0 : 7);
    v1::SaveShardsResponse response;
    grpc::Status s = ps->SaveShards(&ctx, save, &response);
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.name;
  }
  EXPECT_NE(RunShell("test -e " + Quote(checkpoint_dir_ + "/../escaped")).exit_code, 0);
  EXPECT_NE(RunShell("test -e /tmp/escaped-by-path").exit_code, 0);
  EXPECT_NE(RunShell("test -e " + Quote(checkpoint_dir_ + "/" + committed + "/ps-7")).exit_code, 0);
  // Nothing was written through the links.
  EXPECT_EQ(RunShell("ls -A " + Quote(outside)).output, "");
  ExpectTraining();
}

TEST_F(TlsClusterTest, PsctlViewerReadsButOnlyAdminSaves) {
  ShellResult status = Psctl("psctl-viewer", "status");
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("ps:0"));

  ShellResult vars = Psctl("psctl-viewer", "vars");
  EXPECT_EQ(vars.exit_code, 0) << vars.output;

  ShellResult refused = Psctl("psctl-viewer", "save");
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_THAT(refused.output,
              HasSubstr("role viewer (psctl viewer) may not call Coordinator.Checkpoint"));

  ShellResult saved = Psctl("psctl-admin", "save");
  EXPECT_EQ(saved.exit_code, 0) << saved.output;
  ExpectTraining();
}

// The probe the Kubernetes pods run: psctl health with the task's own certificate, as its
// container holds it. The certificate's names are checked: another name fails.
TEST_F(TlsClusterTest, PsctlHealthProbesATaskWithItsOwnCertificate) {
  const std::string ps0 = cluster_->address("ps:0");
  ShellResult serving = Psctl("ps-0", "health " + ps0);
  EXPECT_EQ(serving.exit_code, 0) << serving.output;
  EXPECT_THAT(serving.output, HasSubstr(ps0 + ": SERVING"));

  ShellResult wrong_name = Psctl("ps-0", "health " + ps0 + " --tls_server_name=ps-0.elsewhere");
  EXPECT_EQ(wrong_name.exit_code, 1) << wrong_name.output;
  EXPECT_THAT(wrong_name.output, HasSubstr("health check failed"));

  ShellResult plaintext =
      RunShell(absl::StrCat("exec ", Quote(RunfilePath("cli/psctl")), " health ", ps0));
  EXPECT_EQ(plaintext.exit_code, 1) << plaintext.output;
  ExpectTraining();
}

// The TLS files are watched: a CA added to ps:0's trust file is accepted without a restart
// (this is how a CA is rotated: trust both, reissue, drop the old one).
TEST(TlsRotationTest, ANewlyTrustedCaIsAcceptedWithoutARestart) {
  const std::string dir = TmpDir() + "/rotation";
  const std::string hosts =
      "--chief_hosts 127.0.0.1:0 --ps_hosts 127.0.0.1:0 --worker_hosts 127.0.0.1:0";
  MakeCerts(absl::StrCat("--out ", dir, "/main --cluster mnist ", hosts));
  MakeCerts(absl::StrCat("--out ", dir, "/next --cluster mnist ", hosts));
  TestClusterOptions options = EndlessSyncTraining(/*num_ps=*/1, /*num_workers=*/1);
  options.tls_dir = dir + "/main";
  options.flags["ps"].push_back("--tls_refresh_s=1");
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  TlsConfig next = TlsFilesOf(dir + "/next", "worker-0");
  next.ca_file = dir + "/main/ca.pem";  // the client trusts the server's CA
  GrpcChannelOptions channel;
  channel.tls = next;
  const auto list = [&] {
    auto stub = v1::ParameterServer::NewStub(NewGrpcChannel((*cluster)->address("ps:0"), channel));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::ListShardsResponse listed;
    return stub->ListShards(&ctx, {}, &listed);
  };
  EXPECT_EQ(list().error_code(), grpc::StatusCode::UNAVAILABLE);

  // ps:0 now trusts both CAs (its file is rewritten in place, as a Secret update would).
  const std::string bundle = ReadFile(dir + "/main/ca.pem") + ReadFile(dir + "/next/ca.pem");
  const std::string tmp = dir + "/main/ca.pem.new";
  std::ofstream(tmp) << bundle;
  ASSERT_EQ(std::rename(tmp.c_str(), (dir + "/main/ca.pem").c_str()), 0);
  grpc::Status s;
  for (int i = 0; i < 50; ++i) {
    s = list();
    if (s.ok()) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(s.ok()) << "a certificate of the newly trusted CA is still refused: "
                      << s.error_message();
}

// A daemon checks its own certificate against its task at start: ps:0 given worker:0's
// certificate refuses to start, naming both.
TEST(TlsStartTest, ADaemonRefusesAnotherTasksCertificate) {
  const std::string dir = TmpDir() + "/start-certs";
  MakeCerts(absl::StrCat("--out ", dir,
                         " --cluster mnist --chief_hosts 127.0.0.1:0 --worker_hosts 127.0.0.1:0"));
  const TlsConfig worker = TlsFilesOf(dir, "worker-0");
  ShellResult r = RunShell(
      absl::StrCat("exec ", Quote(RunfilePath("ps_server/ps_server")),
                   " --chief_hosts=127.0.0.1:1 --ps_hosts=127.0.0.1:0 --job_name=ps --task_index=0",
                   " --tls_ca_file=", worker.ca_file, " --tls_cert_file=", worker.cert_file,
                   " --tls_key_file=", worker.key_file));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output,
              HasSubstr("names worker:0 (spiffe://mnist/worker/0) but this task is ps:0"));
}

// Without TLS a daemon serves only loopback, unless told --allow_insecure.
TEST(TlsStartTest, PlaintextBeyondLoopbackIsRefused) {
  ShellResult r = RunShell(
      absl::StrCat("exec ", Quote(RunfilePath("ps_server/ps_server")),
                   " --chief_hosts=127.0.0.1:1 --ps_hosts=0.0.0.0:0 --job_name=ps --task_index=0"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("refusing to serve plaintext on 0.0.0.0:0"));
  EXPECT_THAT(r.output, HasSubstr("--allow_insecure"));
}

}  // namespace
}  // namespace pscluster
