package opspage_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/opspage"
)

// The page in an application's own server, under /ops/kafkaonce/, behind
// the application's authentication (here a toy bearer token).
func ExampleNewHandler() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	page, err := opspage.NewHandler(pool, &opspage.Options{
		Prefix:       "/ops/kafkaonce",
		Brokers:      []string{"localhost:9092"},
		AllowActions: true,
		// A pause records who made it: name the authenticated user.
		Operator: func(r *http.Request) string { return "ops page, user " + r.Header.Get("X-User") },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer page.Close()

	requireOperator := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer operator-token" {
				http.Error(w, "log in first", http.StatusUnauthorized)
				return
			}
			r.Header.Set("X-User", "ada")
			next.ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/kafkaonce/", requireOperator(page))

	// http.ListenAndServe(":8080", mux) in the application; here a test
	// server, asked for the page's liveness with and without the login.
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, token := range []string{"", "operator-token"} {
		req, _ := http.NewRequest("GET", srv.URL+"/ops/kafkaonce/livez", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		res.Body.Close()
		fmt.Println(res.Status)
	}
	// Output:
	// 401 Unauthorized
	// 200 OK
}
